package testkit

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Dialer opens TCP connections to its addresses one after another, without
// pause, closing each at once, and counts those accepted and those refused
// (ECONNREFUSED: no socket listening, as during a cold restart of Envoy):
// the check that a hot restart refuses no connection (#25). It stops at
// Stop, or after maxDials.
type Dialer struct {
	stop                     chan struct{}
	done                     chan struct{}
	stopOnce                 sync.Once
	accepted, refused, other atomic.Int64
	lastErr                  atomic.Value // string
}

// maxDials bounds a Dialer that nobody stops.
const maxDials = 5_000_000

// StartDialer dials addrs in turn until Stop.
func StartDialer(addrs ...string) *Dialer {
	d := &Dialer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		d.run(addrs)
	}()
	return d
}

// StartDialerIn is StartDialer from inside network namespace ns (a name
// under /run/netns), for a listener there: the dialling thread enters it.
func StartDialerIn(t testing.TB, ns string, addrs ...string) *Dialer {
	t.Helper()
	d := &Dialer{stop: make(chan struct{}), done: make(chan struct{})}
	entered := make(chan error, 1)
	go func() {
		defer close(d.done)
		err := enterNetns(ns, func() error {
			entered <- nil
			d.run(addrs)
			return nil
		})
		if err != nil {
			entered <- err
		}
	}()
	if err := <-entered; err != nil {
		t.Fatalf("dialer in %s: %v", ns, err)
	}
	return d
}

func (d *Dialer) run(addrs []string) {
	for i := 0; i < maxDials; i++ {
		select {
		case <-d.stop:
			return
		default:
		}
		c, err := net.DialTimeout("tcp", addrs[i%len(addrs)], 5*time.Second)
		switch {
		case err == nil:
			c.Close()
			d.accepted.Add(1)
		case errors.Is(err, syscall.ECONNREFUSED):
			d.refused.Add(1)
			d.lastErr.Store(err.Error())
		default:
			d.other.Add(1)
			d.lastErr.Store(err.Error())
		}
	}
}

// Stop ends the dialling and waits for the last dial.
func (d *Dialer) Stop() {
	d.stopOnce.Do(func() { close(d.stop) })
	<-d.done
}

// Counts are the connections accepted, refused and failed otherwise so far.
func (d *Dialer) Counts() (accepted, refused, other int64) {
	return d.accepted.Load(), d.refused.Load(), d.other.Load()
}

// LastError is the last dial's error, "" if none failed.
func (d *Dialer) LastError() string {
	s, _ := d.lastErr.Load().(string)
	return s
}
