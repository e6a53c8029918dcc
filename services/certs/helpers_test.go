package certs

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newService is New with a test Runtime; nil clock and reg are the system
// clock and no metrics.
func newService(t testing.TB, cfg Config, out messages.Sink[messages.CertBundle], health messages.Sink[messages.Health],
	log *slog.Logger, clock messages.Clock, reg prometheus.Registerer) *Service {
	t.Helper()
	s, err := New(cfg, out, messages.NewRuntime(Name, health, clock, reg, log))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// bundleRecorder is the certs output: a real Cell plus a count of sends.
type bundleRecorder struct {
	*messages.Cell[messages.CertBundle]
	mu    sync.Mutex
	sends []messages.CertBundle
}

func newBundleRecorder() *bundleRecorder {
	return &bundleRecorder{Cell: messages.NewCell[messages.CertBundle]()}
}

func (r *bundleRecorder) Send(b messages.CertBundle) {
	r.mu.Lock()
	r.sends = append(r.sends, b)
	r.mu.Unlock()
	r.Cell.Send(b)
}

func (r *bundleRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sends)
}

// waitFor waits until a bundle satisfying ok is the latest value.
func (r *bundleRecorder) waitFor(t *testing.T, what string, ok func(messages.CertBundle) bool) messages.CertBundle {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		b, set, changed := r.Watch()
		if set && ok(b) {
			return b
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s (latest %v)", what, b)
		}
	}
}

// healthRecorder keeps every Health sent.
type healthRecorder struct {
	mu     sync.Mutex
	all    []messages.Health
	change chan struct{}
}

func newHealthRecorder() *healthRecorder { return &healthRecorder{change: make(chan struct{})} }

func (h *healthRecorder) Send(v messages.Health) {
	h.mu.Lock()
	h.all = append(h.all, v)
	close(h.change)
	h.change = make(chan struct{})
	h.mu.Unlock()
}

func (h *healthRecorder) latest() (messages.Health, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.all) == 0 {
		return messages.Health{State: -1}, h.change
	}
	return h.all[len(h.all)-1], h.change
}

func (h *healthRecorder) waitFor(t *testing.T, state messages.HealthState, reasonHas string) messages.Health {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		v, changed := h.latest()
		if v.State == state && strings.Contains(v.Reason, reasonHas) {
			return v
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("timed out waiting for health %v with reason containing %q; latest %v %q", state, reasonHas, v.State, v.Reason)
		}
	}
}

// run starts s.Serve and returns a stop function that checks how it ended.
func run(t *testing.T, s *Service) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != context.Canceled {
					t.Errorf("Serve returned %v, want context.Canceled", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Serve did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
