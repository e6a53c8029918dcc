package tree

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// scriptedFailures fails every run; its third run first lasts past the
// policy's healthy period (on the skewed clock).
type scriptedFailures struct {
	clock   *testkit.RecordingClock
	healthy time.Duration
	runs    atomic.Int32
}

func (s *scriptedFailures) String() string { return "envoy" }
func (s *scriptedFailures) Serve(context.Context) error {
	n := s.runs.Add(1)
	if n == 3 {
		s.clock.Skip(s.healthy + time.Second)
	}
	return fmt.Errorf("run %d: %w", n, errFake)
}

// The first failure after a healthy run restarts at once; a crash loop is
// still paced: the second consecutive failure waits (half to all of
// BaseDelay), and so on. Five runs: fail, fail, healthy then fail, fail,
// then the give-up limit.
func TestFirstRestartImmediateThenPaced(t *testing.T) {
	clock := &testkit.RecordingClock{}
	p := DefaultPolicy()
	p.GiveUp = &GiveUp{Restarts: 4, Window: time.Hour}
	svc := &scriptedFailures{clock: clock, healthy: p.HealthyAfter}
	a, err := New(NewChannels(nil), []Node{{Service: svc, Policy: &p}}, prometheus.NewRegistry(), testkit.TestLogger(t), Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	var gu *GiveUpError
	if err := a.Run(context.Background()); !errors.As(err, &gu) || svc.runs.Load() != 5 {
		t.Fatalf("Run = %v after %d runs; want a give-up after 5", err, svc.runs.Load())
	}
	// Runs 1 and 3 (the first failures after start and after a healthy
	// run) restarted without a wait; runs 2 and 4 waited.
	waits := clock.Waits()
	if len(waits) != 2 {
		t.Fatalf("the runner waited %v; want exactly two waits (after the 2nd and 4th failures)", waits)
	}
	for _, d := range waits {
		if d < p.BaseDelay/2 || d > p.BaseDelay {
			t.Fatalf("waits %v; each must be within [%s, %s]", waits, p.BaseDelay/2, p.BaseDelay)
		}
	}
}

// A second Serve of the same runner waits for the first to return, and
// gives up when its own context ends without ever running the service.
func TestRunnerServeIsExclusive(t *testing.T) {
	ch := NewChannels(nil)
	stuck := newStubborn("stuck", ch.Health)
	defer stuck.unstick()
	a, err := New(ch, []Node{{Service: stuck}}, prometheus.NewRegistry(), testkit.TestLogger(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := a.runners["stuck"]
	first := make(chan error, 1)
	firstCtx, cancelFirst := context.WithCancel(context.Background())
	go func() { first <- r.Serve(firstCtx) }()
	testkit.WaitFor(t, "the first run is inside Serve", func() bool { return stuck.active.Load() == 1 })
	cancelFirst() // ignored by the service

	secondCtx, cancelSecond := context.WithCancel(context.Background())
	second := make(chan error, 1)
	go func() { second <- r.Serve(secondCtx) }()
	testkit.WaitFor(t, "the second entry is refused and reported", func() bool {
		h, ok := r.health.Last()
		return ok && h.State == messages.Failed
	})
	cancelSecond()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Fatalf("second Serve = %v, want context.Canceled", err)
	}
	if got := stuck.runs.Load(); got != 1 {
		t.Fatalf("the service ran %d times; the second Serve must not run it", got)
	}

	third := make(chan error, 1)
	thirdCtx, cancelThird := context.WithCancel(context.Background())
	defer cancelThird()
	go func() { third <- r.Serve(thirdCtx) }()
	stuck.unstick()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("first Serve = %v", err)
	}
	testkit.WaitFor(t, "the third Serve runs the service once the first returned", func() bool { return stuck.runs.Load() == 2 })
	if got := stuck.maxActive.Load(); got != 1 {
		t.Fatalf("%d runs at once", got)
	}
	cancelThird()
	<-third
}

// blockingService runs until cancelled, counting its runs.
type blockingService struct {
	runs    atomic.Int32
	started chan int32
}

func (s *blockingService) String() string { return "controlplane" }
func (s *blockingService) Serve(ctx context.Context) error {
	s.started <- s.runs.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

// A chaos kill with a hold (/debug/chaos/kill?for=) keeps the service down
// that long: its next run waits for the hold, not the short first-restart
// delay, and the tree says why.
func TestChaosKillHoldsTheServiceDown(t *testing.T) {
	ch, clock, waitRun := runBlocking(t, func(svc *blockingService) []Node { return []Node{{Service: svc}} })
	waitRun(1)
	const hold = 7 * time.Second
	ch.Chaos.Send(messages.Chaos{Service: "controlplane", For: hold})
	waitRun(2)
	waits := clock.Waits()
	if len(waits) != 1 || waits[0] < hold-time.Second || waits[0] > hold {
		t.Fatalf("waits before the restart %v, want one of about %s (the hold)", waits, hold)
	}
	state, _ := ch.Tree.Get()
	for _, s := range state.Services {
		if s.Name == "controlplane" && (s.Restarts != 1 || s.LastError == "") {
			t.Errorf("controlplane in the tree: %+v, want 1 restart with the kill as last error", s)
		}
	}
}

// A backoff is waited once. A child held down by a chaos kill waits out the
// hold; when its group is killed later, the rebuilt group runs it again at
// once, not after the same hold a second time (a stale delay kept the
// standalone peers down 5 s after a group kill in the chaos suite).
func TestGroupRebuildDoesNotRepeatAChildsBackoff(t *testing.T) {
	ch, clock, waitRun := runBlocking(t, func(svc *blockingService) []Node {
		return []Node{{Name: "peers", Children: []Node{{Service: svc}}}}
	})
	waitRun(1)
	const hold = 7 * time.Second
	ch.Chaos.Send(messages.Chaos{Service: "controlplane", For: hold})
	waitRun(2)
	if waits := clock.Waits(); len(waits) != 1 {
		t.Fatalf("waits after the held kill %v, want the hold only", waits)
	}
	ch.Chaos.Send(messages.Chaos{Service: "peers"})
	waitRun(3)
	if waits := clock.Waits(); len(waits) != 1 {
		t.Fatalf("waits after the group kill %v, want none beyond the hold already waited", waits)
	}
}

// runBlocking runs, until the end of the test, a tree of the nodes made
// around one blockingService on a RecordingClock; waitRun waits for the
// service's run number want to start.
func runBlocking(t *testing.T, nodes func(*blockingService) []Node) (ch *Channels, clock *testkit.RecordingClock, waitRun func(want int32)) {
	t.Helper()
	clock = &testkit.RecordingClock{}
	svc := &blockingService{started: make(chan int32, 4)}
	ch = NewChannels(nil)
	a, err := New(ch, nodes(svc), prometheus.NewRegistry(), testkit.TestLogger(t), Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitRun = func(want int32) {
		t.Helper()
		select {
		case got := <-svc.started:
			if got != want {
				t.Fatalf("run %d started, want %d", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("run %d never started", want)
		}
	}
	return ch, clock, waitRun
}
