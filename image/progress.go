package image

import (
	"fmt"
	"io"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// progress tells the user what the build does: one line per step (a layer
// read, the shape checked, a platform layered, the push), and on a terminal
// also the bytes of the step under way, rewritten in place.
type progress struct {
	w        io.Writer
	terminal bool
	mu       sync.Mutex
	live     bool // a live line is shown and must be cleared first
}

func (p *progress) stepf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLive()
	fmt.Fprintf(p.w, format+"\n", args...)
}

func (p *progress) clearLive() {
	if p.live {
		fmt.Fprint(p.w, "\r\033[K")
		p.live = false
	}
}

// show rewrites the live line (on a terminal only).
func (p *progress) show(step string, done, total int64) {
	if !p.terminal {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if total > 0 {
		fmt.Fprintf(p.w, "\r\033[K%s: %s / %s", step, mib(done), mib(total))
	} else {
		fmt.Fprintf(p.w, "\r\033[K%s: %s", step, mib(done))
	}
	p.live = true
}

// counter is a writer that counts the bytes of step written to it, shown
// live every MiB.
func (p *progress) counter(step string, total int64) io.Writer {
	return &byteCounter{p: p, step: step, total: total}
}

// done ends a step that moved size bytes.
func (p *progress) done(step string, size int64) {
	p.stepf("%s: %s", step, mib(size))
}

type byteCounter struct {
	p           *progress
	step        string
	n, total    int64
	lastShownAt int64
}

func (c *byteCounter) Write(b []byte) (int, error) {
	c.n += int64(len(b))
	if c.n-c.lastShownAt >= 1<<20 || c.n == c.total {
		c.lastShownAt = c.n
		c.p.show(c.step, c.n, c.total)
	}
	return len(b), nil
}

// updates renders go-containerregistry's push progress until it closes the
// channel; done is closed after.
func (p *progress) updates(step string, ch <-chan v1.Update, done chan<- struct{}) {
	defer close(done)
	var last v1.Update
	shown := int64(-1 << 20)
	for u := range ch {
		if u.Error != nil {
			continue // the push returns it
		}
		last = u
		if u.Complete-shown >= 1<<20 || u.Complete == u.Total {
			shown = u.Complete
			p.show(step, u.Complete, u.Total)
		}
	}
	p.done(step, last.Complete)
}

func mib(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
