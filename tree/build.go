package tree

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/thejerf/suture/v4"

	"github.com/meshagent/meshagent/messages"

	"github.com/meshagent/meshagent/services/capture"
	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/dnsproxy"
	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/services/sds"
	"github.com/meshagent/meshagent/services/status"
)

// Config is the agent, as cmd parsed and validated it: one plain config
// per service (nil: the service is not part of this agent) and the
// restart policies.
type Config struct {
	// Status is the status server's config; nil when statusPort is 0.
	Status *status.Config
	// Certs and SDS make the identity subtree.
	Certs *certs.Config
	SDS   *sds.Config
	// Envoy runs Envoy; nil with DISABLE_ENVOY.
	Envoy *envoy.Config
	// Capture verifies (sidecar) or owns (VM) the iptables capture.
	Capture *capture.ServiceConfig
	// DNS is the DNS proxy; NameTableFile, if set, feeds it from a file
	// (tests, standalone mode) instead of NDS.
	DNS           *dnsproxy.Config
	NameTableFile string

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
	var requiredNames []string
	logFor := func(name string) *slog.Logger { return log.With("service", name) }
	// required makes a leaf whose Health readiness waits for.
	required := func(name string, svc suture.Service) Node {
		requiredNames = append(requiredNames, name)
		return Node{Name: name, Service: svc}
	}

	if cfg.Capture != nil {
		nodes = append(nodes, required("capture", capture.New(*cfg.Capture, ch.Health, logFor("capture"))))
	}

	var identity []Node
	if cfg.Certs != nil {
		identity = append(identity, required("certs", certs.New(*cfg.Certs, ch.Certs, ch.Health, logFor("certs"))))
	}
	if cfg.SDS != nil {
		identity = append(identity, required("sds", sds.New(*cfg.SDS, ch.Certs, ch.Health, logFor("sds"))))
	}
	if len(identity) > 0 {
		nodes = append(nodes, Node{Name: "identity", Children: identity})
	}

	debug := map[string]http.Handler{}
	var xds []Node
	if cfg.NameTableFile != "" {
		xds = append(xds, required("nametable", dnsproxy.NewTableFile(cfg.NameTableFile, ch.Names, ch.Health, logFor("nametable"))))
	}
	if cfg.DNS != nil {
		dns, err := dnsproxy.New(*cfg.DNS, ch.Names, ch.Health, reg, logFor("dns"))
		if err != nil {
			return nil, nil, fmt.Errorf("dns proxy: %w", err)
		}
		xds = append(xds, required("dns", dns))
		debug["/debug/ndsz"] = dns.NDSZ()
	}
	if len(xds) > 0 {
		// The xds subtree holds the one upstream connection (with its trust
		// roots): it is rebuilt when the roots change.
		nodes = append(nodes, Node{Name: "xds", Children: xds, RestartWhen: rootsChanged(ch.Certs)})
	}

	if cfg.Envoy != nil {
		policy := cfg.EnvoyPolicy
		nodes = append(nodes, Node{Name: EnvoyService, Policy: &policy,
			Service: envoy.New(*cfg.Envoy, ch.Drain, ch.Envoy, ch.Health, logFor(EnvoyService))})
	}

	if cfg.Status != nil {
		sc := *cfg.Status
		sc.Required = append(sc.Required, requiredNames...)
		sc.RequireEnvoy = cfg.Envoy != nil
		sc.Debug = debug
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

// rootsChanged is the xds subtree's restart trigger: it returns true once
// the trust roots differ from those present when the subtree started (a
// first bundle arriving is not a change).
func rootsChanged(certs messages.Latest[messages.CertBundle]) func(ctx context.Context) bool {
	return func(ctx context.Context) bool {
		start, started, changed := certs.Watch()
		for {
			select {
			case <-ctx.Done():
				return false
			case <-changed:
			}
			var now messages.CertBundle
			now, _, changed = certs.Watch()
			if !started {
				start, started = now, true
				continue
			}
			if !bytes.Equal(now.RootsPEM, start.RootsPEM) {
				return true
			}
		}
	}
}
