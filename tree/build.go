package tree

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"

	"github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/services/capture"
	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/controlplane"
	"github.com/meshagent/meshagent/services/dnsproxy"
	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/services/sds"
	"github.com/meshagent/meshagent/services/status"
	"github.com/meshagent/meshagent/services/xdsproxy"
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
	// XDS is the XDS proxy between Envoy (or proxyless gRPC) and the
	// control plane; it also brings NDS to the DNS proxy.
	XDS *xdsproxy.Config
	// DNS is the DNS proxy; NameTableFile, if set, feeds it from a file
	// (tests, standalone mode) instead of NDS.
	DNS           *dnsproxy.Config
	NameTableFile string
	// ControlPlane and CA are the embedded peers of `meshagent standalone`
	// (nil in a pod): the xDS server the agent's discoveryAddress names and
	// the CA its CA_ADDR names, in a "peers" group.
	ControlPlane *controlplane.Config
	CA           *ca.Config

	DefaultPolicy Policy
	// EnvoyPolicy applies to the envoy service (--envoy-restarts).
	EnvoyPolicy Policy
	StopTimeout time.Duration
	// DrainTimeout bounds the graceful drain at shutdown.
	DrainTimeout time.Duration
}

// Validate checks every service's config (those present) and the tree's
// own settings, and returns every problem, each named by its service.
func (c Config) Validate() error {
	var errs []error
	check := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	check(status.Name, validate(c.Status))
	check(certs.Name, validate(c.Certs))
	check(sds.Name, validate(c.SDS))
	check(envoy.Name, validate(c.Envoy))
	check(capture.Name, validate(c.Capture))
	check(dnsproxy.Name, validate(c.DNS))
	check(xdsproxy.Name, validate(c.XDS))
	check(controlplane.Name, validate(c.ControlPlane))
	check(ca.Name, validate(c.CA))
	check("restart policy", c.DefaultPolicy.Validate())
	check("envoy restart policy", c.EnvoyPolicy.Validate())
	if c.StopTimeout <= 0 {
		check("tree", fmt.Errorf("StopTimeout %v must be positive", c.StopTimeout))
	}
	if c.DrainTimeout < 0 {
		check("tree", fmt.Errorf("DrainTimeout %v is negative", c.DrainTimeout))
	}
	return errors.Join(errs...)
}

// validate is a service's config check, nil for a service left out (its
// config nil).
func validate[C any, P interface {
	*C
	Validate() error
}](c P) error {
	if c == nil {
		return nil
	}
	return c.Validate()
}

// Process is what the process around the tree gives it: how to speak to
// systemd and what to do once the agent is first ready. Process policy
// (the GC target, returning start-up memory) is cmd's (issue 26).
type Process struct {
	Notifier     Notifier
	OnFirstReady func()
}

// Build makes the channels and the services from cfg and assembles the
// tree. It is the only place that calls the services' constructors.
func Build(cfg Config, reg prometheus.Registerer, log *slog.Logger, proc Process) (*Agent, *Channels, error) {
	ch := NewChannels(func(total uint64) {
		log.Warn("health events dropped: the status server is falling behind", "dropped_total", total)
	})
	clock := messages.SystemClock{}
	// runtime is what the service called name gets besides its config and
	// channels; its name comes from the service's own package.
	runtime := func(name string) messages.Runtime {
		return messages.NewRuntime(name, ch.Health, clock, reg, log)
	}
	var nodes []Node
	var requiredNames []string
	// required makes a leaf whose Health readiness waits for.
	required := func(svc Service, rt messages.Runtime) Node {
		requiredNames = append(requiredNames, rt.Health.Name())
		return Node{Service: svc, Health: rt.Health}
	}
	var errs []error
	check := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}

	// The embedded peers come first, so that they start before the agent's
	// first calls to them (which retry anyway). Readiness does not wait for
	// them: an agent serving its cached configuration while its control
	// plane is down is doing its job, and says so in its own health.
	var peers []Node
	if cfg.ControlPlane != nil {
		rt := runtime(controlplane.Name)
		svc, err := controlplane.New(*cfg.ControlPlane, rt)
		check("control plane", err)
		peers = append(peers, Node{Service: svc, Health: rt.Health})
	}
	if cfg.CA != nil {
		rt := runtime(ca.Name)
		svc, err := ca.New(*cfg.CA, rt)
		check("ca", err)
		peers = append(peers, Node{Service: svc, Health: rt.Health})
	}
	if len(peers) > 0 {
		nodes = append(nodes, Node{Name: "peers", Children: peers})
	}

	if cfg.Capture != nil {
		rt := runtime(capture.Name)
		nodes = append(nodes, required(capture.New(*cfg.Capture, rt), rt))
	}

	var identity []Node
	if cfg.Certs != nil {
		rt := runtime(certs.Name)
		svc, err := certs.New(*cfg.Certs, ch.Certs, rt)
		check("certs", err)
		identity = append(identity, required(svc, rt))
	}
	if cfg.SDS != nil {
		rt := runtime(sds.Name)
		svc, err := sds.New(*cfg.SDS, sds.Inputs{Certs: ch.Certs, TrustAnchors: ch.Anchors}, rt)
		check("sds", err)
		identity = append(identity, required(svc, rt))
	}
	if len(identity) > 0 {
		nodes = append(nodes, Node{Name: "identity", Children: identity})
	}

	// The XDS proxy stands alone: it handles new trust roots itself, by
	// redialling (#26), so no event restarts a group around it.
	debug := map[string]http.Handler{}
	if cfg.XDS != nil {
		rt := runtime(xdsproxy.Name)
		svc, err := xdsproxy.New(*cfg.XDS,
			xdsproxy.Inputs{Certs: ch.Certs, Workload: ch.Workload},
			xdsproxy.Outputs{Names: ch.Names, State: ch.XDS, Anchors: ch.Anchors}, rt)
		check("xds proxy", err)
		if err == nil {
			nodes = append(nodes, required(svc, rt))
		}
	}

	// The name table and the DNS proxy are a group of their own (#26):
	// they depend on no trust root, certificate or control plane
	// connection, only on the NameTable channel, which outlives every
	// restart. In the xds group a root rotation restarted the DNS proxy and
	// lost queries.
	var names []Node
	if cfg.NameTableFile != "" {
		rt := runtime(dnsproxy.TableFileName)
		names = append(names, required(dnsproxy.NewTableFile(cfg.NameTableFile, ch.Names, rt), rt))
	}
	if cfg.DNS != nil {
		rt := runtime(dnsproxy.Name)
		dns, err := dnsproxy.New(*cfg.DNS, ch.Names, rt)
		check("dns proxy", err)
		if err == nil {
			names = append(names, required(dns, rt))
			debug["/debug/ndsz"] = dns.NDSZ()
		}
	}
	if len(names) > 0 {
		nodes = append(nodes, Node{Name: "names", Children: names})
	}

	if cfg.Envoy != nil {
		policy := cfg.EnvoyPolicy
		rt := runtime(envoy.Name)
		in := envoy.Inputs{Drain: ch.Drain}
		if cfg.XDS != nil {
			in.XDS = ch.XDS
		}
		svc, err := envoy.New(*cfg.Envoy, in, envoy.Outputs{State: ch.Envoy}, rt)
		check("envoy", err)
		if err == nil {
			nodes = append(nodes, Node{Policy: &policy, Health: rt.Health, Service: svc})
			if cfg.Envoy.CrashDir != "" {
				debug["/debug/crashes"] = envoy.CrashesHandler(cfg.Envoy.CrashDir)
			}
		}
	}

	if cfg.Status != nil {
		// The upstream's state is shown only when there is an XDS proxy.
		var xdsState messages.Latest[messages.XDSState]
		if cfg.XDS != nil {
			xdsState = ch.XDS
		}
		// The certificate and the name table are shown when there is one
		// (#22): nil inputs leave /debug/certs and /debug/names out.
		var certsState messages.Latest[messages.CertBundle]
		if cfg.Certs != nil {
			certsState = ch.Certs
		}
		var namesState messages.Latest[messages.NameTable]
		if cfg.DNS != nil || cfg.NameTableFile != "" || cfg.XDS != nil {
			namesState = ch.Names
		}
		sc := *cfg.Status
		sc.Required = append(sc.Required, requiredNames...)
		sc.RequireEnvoy = cfg.Envoy != nil
		sc.Debug = debug
		rt := runtime(status.Name)
		st, err := status.New(sc,
			status.Inputs{Health: ch.Health, Envoy: ch.Envoy, Tree: ch.Tree, XDS: xdsState, Certs: certsState, Names: namesState},
			status.Outputs{Readiness: ch.Readiness, Drain: ch.Drain, Shutdown: ch.Shutdown, Chaos: ch.Chaos,
				WorkloadHealth: ch.Workload},
			rt)
		check("status server", err)
		if err == nil {
			nodes = append(nodes, Node{Service: st, Health: rt.Health})
		}
	} else {
		// Without a status server nothing computes readiness: the tree
		// counts as ready once it runs (systemd READY=1).
		ch.Readiness.Send(messages.Readiness{Ready: true, Reason: "no status server"})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}

	a, err := New(ch, nodes, reg, log, Options{
		DefaultPolicy: &cfg.DefaultPolicy,
		StopTimeout:   cfg.StopTimeout,
		DrainTimeout:  cfg.DrainTimeout,
		Notifier:      proc.Notifier,
		OnFirstReady:  proc.OnFirstReady,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("building the supervision tree: %w", err)
	}
	return a, ch, nil
}
