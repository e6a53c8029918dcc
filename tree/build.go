package tree

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"

	"github.com/meshagent/meshagent/services/status"
)

// Config is the agent, as cmd parsed and validated it: one plain config
// per service (nil: the service is not part of this agent) and the
// restart policies.
type Config struct {
	// Status is the status server's config; nil when statusPort is 0.
	Status *status.Config

	DefaultPolicy Policy
	// EnvoyPolicy applies to the envoy service (--envoy-restarts).
	EnvoyPolicy Policy
	StopTimeout time.Duration
	// DrainTimeout bounds the graceful drain at shutdown.
	DrainTimeout time.Duration
}

// Build makes the channels and the services from cfg and assembles the
// tree. It is the only place that calls the services' constructors.
func Build(cfg Config, reg prometheus.Registerer, log *slog.Logger, notifier Notifier) (*Agent, *Channels, error) {
	ch := NewChannels(func(total uint64) {
		log.Warn("health events dropped: the status server is falling behind", "dropped_total", total)
	})
	var nodes []Node
	var required []string
	logFor := func(name string) *slog.Logger { return log.With("service", name) }

	if cfg.Status != nil {
		sc := *cfg.Status
		sc.Required = append(sc.Required, required...)
		st := status.New(sc,
			status.Inputs{Health: ch.Health, Envoy: ch.Envoy, Tree: ch.Tree},
			status.Outputs{Readiness: ch.Readiness, Drain: ch.Drain, Shutdown: ch.Shutdown, Chaos: ch.Chaos},
			logFor("status"))
		nodes = append(nodes, Node{Name: "status", Service: st})
	} else {
		// Without a status server nothing computes readiness: the tree
		// counts as ready once it runs (systemd READY=1).
		ch.Readiness.Send(messages.Readiness{Ready: true, Reason: "no status server"})
	}

	a, err := New(ch, nodes, reg, log, Options{
		DefaultPolicy: &cfg.DefaultPolicy,
		StopTimeout:   cfg.StopTimeout,
		DrainTimeout:  cfg.DrainTimeout,
		Notifier:      notifier,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("building the supervision tree: %w", err)
	}
	return a, ch, nil
}
