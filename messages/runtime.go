package messages

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// Runtime is what every service receives from the tree besides its config
// and its channels: the one health reporter, the one clock, the one way to
// register metrics, and a logger that already names the service.
type Runtime struct {
	Health *Reporter
	Clock  Clock
	// Metrics receives the service's collectors; nil registers nothing
	// (tests that do not look at metrics).
	Metrics prometheus.Registerer
	Log     *slog.Logger
}

// NewRuntime is a Runtime for the service called name that reports on
// health; nil metrics registers nothing, a nil clock is the system clock and
// a nil log discards.
func NewRuntime(name string, health Sink[Health], clock Clock, metrics prometheus.Registerer, log *slog.Logger) Runtime {
	if clock == nil {
		clock = SystemClock{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return Runtime{
		Health:  NewReporter(name, health, clock),
		Clock:   clock,
		Metrics: metrics,
		Log:     log.With("service", name),
	}
}

// Register registers a service's collectors, the one way services do it.
// Each service registers once, in its constructor: a restart reuses them.
func (rt Runtime) Register(cs ...prometheus.Collector) error {
	if rt.Metrics == nil {
		return nil
	}
	for _, c := range cs {
		if err := rt.Metrics.Register(c); err != nil {
			return fmt.Errorf("registering %s metrics: %w", rt.Health.Name(), err)
		}
	}
	return nil
}
