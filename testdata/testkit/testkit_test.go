package testkit

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/messages"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLogBuffer(t *testing.T) {
	b := NewLogBuffer(t)
	log := b.Logger()
	done := make(chan struct{})
	go func() { log.Debug("from another goroutine", "k", "v"); close(done) }()
	b.WaitLine(t, "level=DEBUG", "from another goroutine", "k=v")
	<-done
	if !strings.Contains(b.String(), `msg="from another goroutine"`) {
		t.Fatalf("log %q", b)
	}
}

func TestTestLoggerDropsLinesAfterTheTest(t *testing.T) {
	var after *slog.Logger
	t.Run("sub", func(t *testing.T) {
		after = TestLogger(t)
		after.Info("during the test")
	})
	after.Info("after the test: dropped, and no panic")
}

func TestRecorder(t *testing.T) {
	var r Recorder[int]
	if _, ok := r.Get(); ok {
		t.Fatal("an empty recorder has a value")
	}
	go func() {
		for i := 1; i <= 3; i++ {
			r.Send(i)
		}
	}()
	got := r.WaitFor(t, "three values", func(v []int) bool { return len(v) == 3 })
	if !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("values %v", got)
	}
	if v := r.WaitLast(t, "3", func(v int) bool { return v == 3 }); v != 3 || r.Len() != 3 {
		t.Fatalf("last %d, len %d", v, r.Len())
	}
	// A Latest like a Cell: WaitValue works on it too.
	if v := WaitValue[int](t, &r, "3", func(v int) bool { return v == 3 }); v != 3 {
		t.Fatal(v)
	}
	stop := make(chan struct{})
	close(stop)
	if r.Reached(func(v []int) bool { return len(v) == 4 }, stop) {
		t.Fatal("reached a fourth value never sent")
	}
}

func TestHealthRecorder(t *testing.T) {
	var h HealthRecorder
	h.Send(messages.Health{Service: "a", State: messages.Starting, Reason: "waiting for the file"})
	h.Send(messages.Health{Service: "b", State: messages.Ready})
	if got := h.WaitService(t, "a", messages.Starting, "the file"); got.Service != "a" {
		t.Fatalf("got %+v", got)
	}
	if got := h.WaitState(t, messages.Ready, ""); got.Service != "b" {
		t.Fatalf("got %+v", got)
	}
	if !h.Saw("a", messages.Starting, "waiting") || h.Saw("b", messages.Starting, "") || !h.Saw("", messages.Ready, "") {
		t.Fatal("Saw is wrong")
	}
}

func TestWaitValue(t *testing.T) {
	c := messages.NewCell[string]()
	go c.Send("x")
	if v := WaitValue[string](t, c, "x", func(v string) bool { return v == "x" }); v != "x" {
		t.Fatal(v)
	}
}

func TestWaitFor(t *testing.T) {
	start := time.Now()
	WaitFor(t, "20ms to pass", func() bool { return time.Since(start) > 20*time.Millisecond })
}

func TestManualClock(t *testing.T) {
	c := NewManualClock()
	t0 := c.Now()
	if _, ok := <-c.After(0); !ok {
		t.Fatal("After(0) does not fire at once")
	}
	fired := c.After(time.Second)
	c.Advance(999 * time.Millisecond)
	select {
	case <-fired:
		t.Fatal("fired early")
	default:
	}
	c.Advance(time.Millisecond)
	if at := <-fired; !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("fired at %v", at)
	}
	// AdvanceUntil steps only while something waits.
	done := make(chan struct{})
	go func() {
		for i := 0; i < 3; i++ {
			<-c.After(time.Minute)
		}
		close(done)
	}()
	if !c.AdvanceUntil(t, time.Minute, 10, done) {
		t.Fatal("AdvanceUntil did not see done")
	}
	if got := c.Now().Sub(t0); got != time.Second+3*time.Minute {
		t.Fatalf("advanced %v", got)
	}
}

func TestFrozenClock(t *testing.T) {
	at := time.Unix(1700000000, 0)
	c := FrozenClock{At: at}
	<-c.After(time.Millisecond)
	if !c.Now().Equal(at) {
		t.Fatal("the frozen clock moved")
	}
}

type canceledService struct{}

func (canceledService) Serve(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
func (canceledService) String() string                  { return "canceled" }

type failingService struct{}

func (failingService) Serve(context.Context) error { return errors.New("boom") }

func TestServe(t *testing.T) {
	s := Serve(t, canceledService{})
	s.Stop(t)
	s.Stop(t) // a second Stop does nothing
	if !errors.Is(s.Err(), context.Canceled) {
		t.Fatal(s.Err())
	}
	f := Serve(t, failingService{})
	if err := f.Wait(t); err == nil || err.Error() != "boom" {
		t.Fatalf("Wait: %v", err)
	}
	// Stop at the end of the test accepts it: Wait took the result.
}

func TestFreeAddr(t *testing.T) {
	if p := FreePort(t); p <= 0 {
		t.Fatal(p)
	}
	if a := FreeAddr(t); !strings.HasPrefix(a, "127.0.0.1:") {
		t.Fatal(a)
	}
}

func TestFiles(t *testing.T) {
	dir := ShortTempDir(t, "kit")
	if len(dir) > 40 {
		t.Errorf("%s is not short", dir)
	}
	p := filepath.Join(dir, "a/b/c")
	WriteFile(t, p, []byte("1"))
	ReplaceFile(t, p, []byte("2"))
	if b, _ := os.ReadFile(p); string(b) != "2" {
		t.Fatalf("%q", b)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
}

func TestMetricValue(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "h"}, []string{"k"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "h"})
	reg.MustRegister(c, g)
	c.WithLabelValues("a").Add(2)
	c.WithLabelValues("b").Add(3)
	g.Set(7)
	if v := MetricValue(t, reg, "c_total", "k", "b"); v != 3 {
		t.Errorf("c_total{k=b} = %v", v)
	}
	if v := MetricValue(t, reg, "c_total"); v != 5 {
		t.Errorf("c_total = %v, want the sum of its series", v)
	}
	if v := MetricValue(t, reg, "g"); v != 7 {
		t.Errorf("g = %v", v)
	}
	if v := MetricValue(t, reg, "missing"); v != 0 {
		t.Errorf("missing = %v", v)
	}
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h_seconds", Help: "h"})
	reg.MustRegister(h)
	h.Observe(1)
	h.Observe(2)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	parsed := Families{}
	for _, mf := range mfs {
		parsed[mf.GetName()] = mf
	}
	if v := MetricSample(t, parsed, "h_seconds"); v != 2 {
		t.Errorf("h_seconds = %v, want its sample count", v)
	}
	if v := MetricSample(t, parsed, "c_total", "k", "a"); v != 2 {
		t.Errorf("parsed c_total{k=a} = %v", v)
	}
}

type positive int

func (p positive) Validate() error {
	if p <= 0 {
		return errors.New("not positive")
	}
	return nil
}

// EachEditRejected fails a test for a bad good value and for an edit that
// is accepted.
func TestEachEditRejected(t *testing.T) {
	EachEditRejected(t, positive(1), map[string]func(*positive){
		"zero":     func(p *positive) { *p = 0 },
		"negative": func(p *positive) { *p = -1 },
	})
	r := &errorsTB{TB: t}
	EachEditRejected(r, positive(1), map[string]func(*positive){"two": func(p *positive) { *p = 2 }})
	if len(r.errs) != 1 || r.errs[0] != "two: accepted" {
		t.Errorf("reported %q; want the accepted edit named", r.errs)
	}
}

// ProcStat reads this process's name and its fields after the name: the
// name is /proc/self/comm's, its parent is os.Getppid().
func TestProcStat(t *testing.T) {
	comm, fields, err := ProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile("/proc/self/comm")
	if comm != strings.TrimSpace(string(want)) || len(fields) < 2 || fields[1] != strconv.Itoa(os.Getppid()) {
		t.Fatalf("ProcStat = %q %q; want comm %q and ppid %d second", comm, fields, want, os.Getppid())
	}
	if _, _, err := ProcStat(-1); err == nil {
		t.Fatal("ProcStat(-1): no error")
	}
}
