package tree

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"

	"github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/services/capture"
	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/controlplane"
	"github.com/meshagent/meshagent/services/dnsproxy"
	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/services/nametable"
	"github.com/meshagent/meshagent/services/sds"
	"github.com/meshagent/meshagent/services/status"
	"github.com/meshagent/meshagent/services/xdsproxy"
)

// Config is the agent, as cmd's configuration built it: one plain config
// per service (nil: the service is not part of this agent) and the
// restart policies. Each service's New validates its config, once, in
// Build (#26).
type Config struct {
	// Status is the status server's config; nil when statusPort is 0.
	Status *status.Config
	// Certs and SDS make the identity subtree.
	Certs *certs.Config
	SDS   *sds.Config
	// Envoy runs Envoy; nil with DISABLE_ENVOY.
	Envoy *envoy.Config
	// Capture verifies (sidecar) or owns (VM) the iptables capture.
	Capture *capture.Config
	// XDS is the XDS proxy between Envoy (or proxyless gRPC) and the
	// control plane; it also brings NDS to the DNS proxy.
	XDS *xdsproxy.Config
	// DNS is the DNS proxy; NameTable, if set, feeds it from a file
	// (--name-table: tests, standalone mode) instead of NDS.
	DNS       *dnsproxy.Config
	NameTable *nametable.Config
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

// Process is what the process around the tree gives it: the clock, the
// metrics registry, how to speak to systemd and what to do once the agent
// is first ready. Process policy (the GC target, returning start-up
// memory) is cmd's (issue 26).
type Process struct {
	// Clock is every service's clock: cmd's is messages.SystemClock, a
	// test's may be manual (issue 34). Required.
	Clock messages.Clock
	// Metrics is the agent's registry: every service registers its
	// collectors on it, and the status server serves it. Required.
	Metrics      Registry
	Notifier     Notifier
	OnFirstReady func()
}

// Registry is a metrics registry: where services register, and what the
// status server gathers (a *prometheus.Registry).
type Registry interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// Build makes the channels and the services from cfg and assembles the
// tree. It is the only place of the agent that calls the services'
// constructors, and it calls them all the same way (node): a nil config
// leaves the service out, and every constructor's error is reported, each
// named by its service.
func Build(cfg Config, log *slog.Logger, proc Process) (*Agent, *Channels, error) {
	if proc.Clock == nil || proc.Metrics == nil {
		return nil, nil, errors.New("building the supervision tree: Process.Clock and Process.Metrics are required")
	}
	ch := NewChannels(func(total uint64) {
		log.Warn("health events dropped: the status server is falling behind", "dropped_total", total)
	})
	b := &builder{ch: ch, clock: proc.Clock, reg: proc.Metrics, log: log}
	// The XDS proxy's state is read (by Envoy's crash records, by the
	// status server's view of the upstream) only when there is an XDS
	// proxy to write it.
	var xdsState messages.Latest[messages.XDSState]
	if cfg.XDS != nil {
		xdsState = ch.XDS
	}
	// The certificate and the name table are shown on /debug/certs and
	// /debug/names when some service writes them (#22).
	var certsState messages.Latest[messages.CertBundle]
	if cfg.Certs != nil {
		certsState = ch.Certs
	}
	var namesState messages.Latest[messages.NameTable]
	if cfg.DNS != nil || cfg.NameTable != nil || cfg.XDS != nil {
		namesState = ch.Names
	}

	// The embedded peers come first, so that they start before the agent's
	// first calls to them (which retry anyway). Readiness does not wait for
	// them: an agent serving its cached configuration while its control
	// plane is down is doing its job, and says so in its own health.
	peers := slices.Concat(
		node(b, optional, controlplane.Name, controlplane.New, cfg.ControlPlane, controlplane.Inputs{}, controlplane.Outputs{}),
		node(b, optional, ca.Name, ca.New, cfg.CA, ca.Inputs{}, ca.Outputs{}),
	)
	capturing := node(b, required, capture.Name, capture.New, cfg.Capture, capture.Inputs{}, capture.Outputs{})
	identity := slices.Concat(
		node(b, required, certs.Name, certs.New, cfg.Certs, certs.Inputs{TrustAnchors: ch.Anchors}, certs.Outputs{Certs: ch.Certs}),
		node(b, required, sds.Name, sds.New, cfg.SDS, sds.Inputs{Certs: ch.Certs, TrustAnchors: ch.Anchors}, sds.Outputs{}),
	)
	// The XDS proxy stands alone: it handles new trust roots itself, by
	// redialling (#26), so no event restarts a group around it.
	xds := node(b, required, xdsproxy.Name, xdsproxy.New, cfg.XDS,
		xdsproxy.Inputs{Certs: ch.Certs, Workload: ch.Workload},
		xdsproxy.Outputs{Names: ch.Names, State: ch.XDS, Anchors: ch.Anchors})
	// The name table and the DNS proxy are a group of their own (#26):
	// they depend on no trust root, certificate or control plane
	// connection, only on the NameTable channel, which outlives every
	// restart. In the xds group a root rotation restarted the DNS proxy and
	// lost queries.
	names := slices.Concat(
		node(b, required, nametable.Name, nametable.New, cfg.NameTable, nametable.Inputs{}, nametable.Outputs{Table: ch.Names}),
		node(b, required, dnsproxy.Name, dnsproxy.New, cfg.DNS, dnsproxy.Inputs{Table: ch.Names}, dnsproxy.Outputs{Answering: ch.DNS}),
	)
	proxy := node(b, optional, envoy.Name, envoy.New, cfg.Envoy,
		envoy.Inputs{Drain: ch.Drain, XDS: xdsState, AgentReady: ch.Readiness}, envoy.Outputs{State: ch.Envoy})
	for i := range proxy {
		proxy[i].Policy = &cfg.EnvoyPolicy
	}
	// The status server comes last: readiness waits for the required
	// services above, and it serves their debug pages. What it needs of
	// them it gets in its Inputs, as their channels (issue 34).
	statusNode := node(b, optional, status.Name, status.New, cfg.Status,
		status.Inputs{Health: ch.Health, Envoy: ch.Envoy, Tree: ch.Tree, XDS: xdsState, Certs: certsState, Names: namesState,
			Required: slices.Clone(b.required), RequireEnvoy: cfg.Envoy != nil, Metrics: proc.Metrics, Debug: debugPages(cfg, ch)},
		status.Outputs{Readiness: ch.Readiness, Drain: ch.Drain, Shutdown: ch.Shutdown, Chaos: ch.Chaos, WorkloadHealth: ch.Workload})
	if err := errors.Join(b.errs...); err != nil {
		return nil, nil, err
	}
	if cfg.Status == nil {
		// Without a status server nothing computes readiness: the tree
		// counts as ready once it runs (systemd READY=1).
		ch.Readiness.Send(messages.Readiness{Ready: true, Reason: "no status server"})
	}

	nodes := slices.Concat(group("peers", peers), capturing, group("identity", identity), xds, group("names", names), proxy, statusNode)
	a, err := New(ch, nodes, proc.Metrics, log, Options{
		Clock:         proc.Clock,
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

// builder is what Build's nodes share: the channels, what every runtime is
// made of, the services readiness waits for, and the constructors' errors.
type builder struct {
	ch       *Channels
	clock    messages.Clock
	reg      prometheus.Registerer
	log      *slog.Logger
	required []string
	errs     []error
}

// Whether readiness waits for a service.
const (
	required = true
	optional = false
)

// node makes one service, if cfg is not nil, through its package's New: the
// one face every service has (#26), New(cfg, in, out, rt) (*Service, error),
// with rt named after the service. A failed New is collected under the
// service's name, so that Build reports every bad service at once; a
// required service's Health is one readiness waits for. It returns the
// service's node, or none.
func node[C, I, O any, S Service](b *builder, req bool, name string, newService func(C, I, O, messages.Runtime) (S, error), cfg *C, in I, out O) []Node {
	if cfg == nil {
		return nil
	}
	rt := messages.NewRuntime(name, b.ch.Health, b.clock, b.reg, b.log)
	svc, err := newService(*cfg, in, out, rt)
	if err != nil {
		b.errs = append(b.errs, fmt.Errorf("%s: %w", name, err))
		return nil
	}
	if req {
		b.required = append(b.required, name)
	}
	return []Node{{Service: svc, Health: rt.Health}}
}

// debugPages are the read-only pages of other services' packages, for the
// status server to serve: the DNS proxy's table as it publishes it, Envoy's
// crash records from their directory. Each reads what its service writes,
// never the service (issue 34).
func debugPages(cfg Config, ch *Channels) map[string]status.DebugPage {
	pages := map[string]status.DebugPage{}
	if cfg.DNS != nil {
		pages["/debug/ndsz"] = status.DebugPage{Handler: dnsproxy.NDSZ(ch.DNS),
			Doc: "the DNS proxy's name table and the names generated from it"}
	}
	if cfg.Envoy != nil && cfg.Envoy.CrashDir != "" {
		pages["/debug/crashes"] = status.DebugPage{Handler: envoy.CrashesHandler(cfg.Envoy.CrashDir),
			Doc: "Envoy's crash records, newest first: exit, uptime, stderr tail, ACKed versions"}
	}
	return pages
}

// group is a group node of children, or nothing when there are none.
func group(name string, children []Node) []Node {
	if len(children) == 0 {
		return nil
	}
	return []Node{{Name: name, Children: children}}
}
