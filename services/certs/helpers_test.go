package certs

import (
	"context"
	"log/slog"
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
