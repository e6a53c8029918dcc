package tree

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/thejerf/suture/v4"
)

// signallingService fails each run after telling the benchmark it started.
type signallingService struct{ started chan struct{} }

func (s *signallingService) String() string { return "bench" }
func (s *signallingService) Serve(context.Context) error {
	s.started <- struct{}{}
	return errFake
}

// measure times b.N restarts after the first run, then stops the
// supervisor (cancel) and waits for it (done), draining the runs that
// start meanwhile.
func (s *signallingService) measure(b *testing.B, cancel context.CancelFunc, done <-chan error) {
	<-s.started
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		<-s.started
	}
	b.StopTimer()
	cancel()
	go func() {
		for range s.started {
		}
	}()
	<-done
	close(s.started)
}

// BenchmarkRestartThroughRunner measures failure → next run through our
// backoff runner (delay 0, so only the machinery is measured);
// BenchmarkRestartBareSuture is the baseline: suture restarting the same
// service directly. Their ratio is the runner's overhead per restart.
func BenchmarkRestartThroughRunner(b *testing.B) {
	svc := &signallingService{started: make(chan struct{})}
	p := Policy{BaseDelay: 0, MaxDelay: 0, Multiplier: 1, HealthyAfter: 1 << 62}
	a, err := New(NewChannels(nil), []Node{{Name: "bench", Service: svc, Policy: &p}}, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	svc.measure(b, cancel, done)
}

func BenchmarkRestartBareSuture(b *testing.B) {
	svc := &signallingService{started: make(chan struct{})}
	sup := suture.New("bench", suture.Spec{FailureThreshold: 1e9, FailureDecay: 1, EventHook: func(suture.Event) {}})
	sup.Add(svc)
	ctx, cancel := context.WithCancel(context.Background())
	done := sup.ServeBackground(ctx)
	svc.measure(b, cancel, done)
}
