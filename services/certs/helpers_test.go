package certs

import (
	"log/slog"
	"testing"

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
	s, err := New(cfg, Inputs{}, Outputs{Certs: out}, messages.NewRuntime(Name, health, clock, reg, log))
	if err != nil {
		t.Fatal(err)
	}
	return s
}
