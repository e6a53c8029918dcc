package tree

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// stubbornService ignores cancellation on its first run until released (a
// service stuck in a blocking call), and counts how many of its Serves run
// at once: suture's contract, and ours, is never more than one.
type stubbornService struct {
	name      string
	health    messages.Sink[messages.Health]
	release   chan struct{}
	once      sync.Once
	runs      atomic.Int32
	active    atomic.Int32
	maxActive atomic.Int32
}

func newStubborn(name string, health messages.Sink[messages.Health]) *stubbornService {
	return &stubbornService{name: name, health: health, release: make(chan struct{})}
}

func (s *stubbornService) String() string { return s.name }

func (s *stubbornService) Serve(ctx context.Context) error {
	run := s.runs.Add(1)
	n := s.active.Add(1)
	defer s.active.Add(-1)
	for m := s.maxActive.Load(); n > m && !s.maxActive.CompareAndSwap(m, n); m = s.maxActive.Load() {
	}
	s.health.Send(messages.Health{Service: s.name, State: messages.Ready, Time: time.Now()})
	if run == 1 {
		<-s.release // deaf to ctx
		return ctx.Err()
	}
	<-ctx.Done()
	return ctx.Err()
}

// unstick lets the first run return; safe to call twice (the test and its
// cleanup).
func (s *stubbornService) unstick() { s.once.Do(func() { close(s.release) }) }

// serviceInfo is the service's node in /debug/tree (JSON).
func (h *harness) serviceInfo(name string) (messages.ServiceInfo, bool) {
	h.t.Helper()
	_, body := h.get("/debug/tree?format=json")
	var tree struct {
		Services []messages.ServiceInfo `json:"services"`
	}
	if err := json.Unmarshal([]byte(body), &tree); err != nil {
		return messages.ServiceInfo{}, false
	}
	for _, s := range tree.Services {
		if s.Name == name {
			return s, true
		}
	}
	return messages.ServiceInfo{}, false
}

// A child that ignores cancellation for longer than the stop timeout while
// its subtree is rebuilt: suture abandons it and the rebuilt supervisor
// starts the same runner again. Its Serve must not be entered a second time
// while the first is still inside; the overrun is reported (metric,
// /debug/tree, readiness), its sibling comes back at once, and the stuck
// service runs again as soon as its old Serve returns.
func TestSubtreeRebuildNeverOverlapsAStuckChild(t *testing.T) {
	ch := NewChannels(nil)
	stuck := newStubborn("stuck", ch.Health)
	sibling := &readyService{name: "dns", health: ch.Health}
	h := newHarnessWith(t, ch, []Node{{Name: "names",
		Children: []Node{{Name: "stuck", Service: stuck}, {Name: "dns", Service: sibling}}}},
		Options{StopTimeout: 20 * time.Millisecond}, []string{"stuck", "dns"})
	t.Cleanup(stuck.unstick) // runs before the harness stops: no leak on failure
	h.waitStatus("/healthz/ready", 200)

	h.ch.Chaos.Send(messages.Chaos{Service: "names"})
	// Either the second Serve overlapped the first (the bug), or the
	// runner refused it and said so.
	testkit.WaitFor(t, "the rebuilt subtree asks for stuck again", func() bool {
		if stuck.maxActive.Load() > 1 {
			return true
		}
		n, ok := h.serviceInfo("stuck")
		return ok && strings.Contains(n.Reason, "previous run has not returned")
	})
	if got := stuck.maxActive.Load(); got != 1 {
		t.Fatalf("%d Serves of stuck ran at once, want 1", got)
	}
	if got := stuck.runs.Load(); got != 1 {
		t.Fatalf("stuck entered Serve %d times while its first run was still inside", got)
	}
	testkit.WaitFor(t, "the sibling is rebuilt without waiting for stuck", func() bool { return sibling.runs.Load() == 2 })
	if got := h.counter("meshagent_service_stop_timeouts_total", "stuck"); got != 1 {
		t.Fatalf("stop timeouts of stuck = %v, want 1", got)
	}
	if n, _ := h.serviceInfo("stuck"); n.StopTimeouts != 1 || !strings.Contains(n.LastError, "did not stop") {
		t.Fatalf("/debug/tree shows stuck as %+v; want 1 stop timeout and the reason", n)
	}
	if body := h.waitStatus("/healthz/ready", 503); !strings.Contains(body, "stuck") {
		t.Fatalf("readiness does not name the stuck service: %q", body)
	}

	stuck.unstick()
	testkit.WaitFor(t, "stuck runs again once its old Serve returned", func() bool { return stuck.runs.Load() == 2 })
	h.waitStatus("/healthz/ready", 200)
	if got := stuck.maxActive.Load(); got != 1 {
		t.Fatalf("%d Serves of stuck ran at once, want 1", got)
	}
	if got := h.counter("meshagent_service_restarts_total", "stuck"); got != 0 {
		t.Fatalf("stuck restarts = %v, want 0 (it was rebuilt, not failed)", got)
	}
}

// A service that ignores cancellation does not hang shutdown: Run returns
// once the stop timeout has passed, with the service still stuck, and the
// overrun is counted.
func TestShutdownIsBoundedWhenAServiceIgnoresCancellation(t *testing.T) {
	ch := NewChannels(nil)
	stuck := newStubborn("stuck", ch.Health)
	h := newHarnessWith(t, ch, []Node{{Name: "identity", Children: []Node{{Name: "stuck", Service: stuck}}}},
		Options{StopTimeout: 20 * time.Millisecond}, []string{"stuck"})
	t.Cleanup(stuck.unstick)
	h.waitStatus("/healthz/ready", 200)

	h.stop()
	if err := h.waitRun("shutdown despite a service that ignores cancellation"); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if stuck.active.Load() != 1 {
		t.Fatal("the stuck service returned; the test proves nothing")
	}
	if got := h.counter("meshagent_service_stop_timeouts_total", "stuck"); got != 1 {
		t.Fatalf("stop timeouts of stuck = %v, want 1", got)
	}
	if got := h.counter("meshagent_service_stop_timeouts_total", "identity"); got != 0 {
		t.Fatalf("the group was reported too (%v): the report must name the service that hung", got)
	}
	stuck.unstick()
	testkit.WaitFor(t, "the stuck service returns once released", func() bool { return stuck.active.Load() == 0 })
}
