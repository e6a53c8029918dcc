// Package status is the agent's status server on :15020: readiness for
// kubelet (behind Envoy's 15021) or systemd, the supervision tree, the
// agent's Prometheus metrics, /quitquitquit, pprof and the chaos endpoints.
// Two of its endpoints are libraries of their own (#26): the merged metrics
// (package metricsmerge) and the application's probes (package appprobe).
package status

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/status/appprobe"
	"github.com/meshagent/meshagent/services/status/metricsmerge"
)

// Config is the status server's configuration.
type Config struct {
	// Addr is where to listen, ":15020" (ProxyConfig.statusPort).
	Addr string
	// Chaos enables POST /debug/chaos/kill (--chaos, MESHAGENT_CHAOS=1).
	Chaos bool
	// Profiling serves /debug/pprof/ to loopback callers (--profiling).
	Profiling bool
	// Probes: application probe rewriting and the VM readiness probe
	// (package appprobe).
	Probes appprobe.Config
	// Metrics: what /stats/prometheus merges besides the agent's registry
	// (Inputs.Metrics; package metricsmerge).
	Metrics metricsmerge.Config
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("status address %q: %w", c.Addr, err)
	}
	return nil
}

// DebugPage is a page of another service's package: its handler and the
// line GET / shows for it (the offering package says what it is). The
// handler reads what the service publishes (a channel, a directory), never
// the service (issue 34).
type DebugPage struct {
	Handler http.Handler
	Doc     string
}

// Inputs are what the status server reads.
type Inputs struct {
	Health messages.Source[messages.Health]
	Envoy  messages.Latest[messages.EnvoyState]
	Tree   messages.Latest[messages.TreeState]
	// XDS is the XDS proxy's upstream, shown in /debug/tree (xdsview.go);
	// nil when the agent has no XDS proxy.
	XDS messages.Latest[messages.XDSState]
	// Certs and Names are the workload certificate and the DNS name
	// table, shown on /debug/certs, /debug/names and the status page
	// (identityview.go, issue 22); nil when the agent has none.
	Certs messages.Latest[messages.CertBundle]
	Names messages.Latest[messages.NameTable]

	// What the tree knows of the agent it built (issue 34: handed over
	// like the channels, never written into Config after cmd built it).

	// Required are the services whose Health must be Ready (or Degraded)
	// for /healthz/ready to answer 200.
	Required []string
	// RequireEnvoy: readiness also needs EnvoyState.Ready (the agent runs
	// Envoy).
	RequireEnvoy bool
	// Metrics is the agent's metrics registry, served on /stats/prometheus
	// with Istio's istio_agent_ prefix (package metricsmerge). Required.
	Metrics prometheus.Gatherer
	// Debug are read-only debug pages of other services' packages, by path
	// ("/debug/ndsz"), served to loopback callers only and listed on GET /
	// with their Doc.
	Debug map[string]DebugPage
}

// Outputs are what the status server sends.
type Outputs struct {
	Readiness messages.Sink[messages.Readiness]
	Drain     messages.Sink[messages.Drain]
	Shutdown  messages.Sink[messages.Shutdown]
	Chaos     messages.Sink[messages.Chaos]
	// WorkloadHealth is the verdict of Probes.Workload, sent on changes.
	WorkloadHealth messages.Sink[messages.WorkloadHealth]
}

// Name is the service's name in logs, metrics, Health and /debug/tree.
const Name = "status"

// Service is the status server.
type Service struct {
	cfg    Config
	in     Inputs
	out    Outputs
	health *messages.Reporter
	clock  messages.Clock
	log    *slog.Logger

	// healths is the latest Health per service. It survives restarts of
	// this service (health is an event stream: what was consumed is gone)
	// and is touched only by Serve's state loop.
	healths map[string]messages.Health
	// view is the state loop's latest conclusion, read by HTTP handlers.
	view atomic.Pointer[view]

	prober   *appprobe.Prober
	metrics  *metricsmerge.Handler
	workload workloadVerdict // touched only by runWorkloadProbe

	// startedAt is when the agent started, as near as the status server
	// knows: its construction, while the tree is built, after the
	// configuration is parsed (milliseconds after the process started).
	startedAt time.Time
	// startup is Istio's startup_duration_seconds; it has no sample until
	// the agent is first ready, so that "not ready yet" never reads as 0s.
	startup *prometheus.GaugeVec
	// startupRecorded: the first readiness was recorded. Like healths it
	// survives restarts of this service, and is touched only by the state
	// loop.
	startupRecorded bool
	// limits bound the requests served at once, per route class
	// (limits.go).
	limits limiter
}

// view is an immutable snapshot for the HTTP handlers.
type view struct {
	ready   bool
	reason  string
	healths map[string]messages.Health
}

// New returns the status server.
func New(cfg Config, in Inputs, out Outputs, rt messages.Runtime) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if in.Metrics == nil {
		return nil, errors.New("status: Inputs.Metrics (the agent's metrics registry) is required")
	}
	s := &Service{cfg: cfg, in: in, out: out, health: rt.Health, clock: rt.Clock, log: rt.Log, healths: map[string]messages.Health{}, limits: newLimiter()}
	s.view.Store(&view{reason: "starting"})
	s.prober = appprobe.New(cfg.Probes, rt.Log)
	var mm messages.Metrics
	s.metrics = metricsmerge.New(cfg.Metrics, in.Metrics, rt.Log, &mm)
	s.startedAt = rt.Clock.Now()
	s.startup = mm.GaugeVec("startup_duration_seconds", "The time from the process starting to being marked ready.")
	if err := rt.Register(mm.Collectors()...); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Service) String() string { return Name }

// Serve listens and serves until ctx is done.
func (s *Service) Serve(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("status server: listen %s: %w", s.cfg.Addr, err)
	}
	ln = limitListener(ln)
	srv := newServer(ctx, s.routes())
	// The first verdict is reached before the first request is answered,
	// so that a probe never sees a bare "starting" from a server that
	// already knows why it is not ready.
	s.catchUp()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	s.log.Info("status server listening", "addr", ln.Addr().String())
	defer s.closeIdleConnections() // last: handlers and workers are done
	var workers sync.WaitGroup
	defer workers.Wait()
	workersCtx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	if s.cfg.Probes.Workload != nil {
		workers.Go(func() { s.runWorkloadProbe(workersCtx) })
	}

	loopErr := s.stateLoop(ctx, served)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	srv.Close()
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("status server: %w", err)
	}
	return loopErr
}

// catchUp folds what happened before this run into the health map and
// reaches the first verdict.
func (s *Service) catchUp() {
	// Reports queued while this service was down (its own failure among
	// them) come first: they are older than this run.
	for _, h := range s.in.Health.Take() {
		s.healths[h.Service] = h
	}
	s.health.Report(messages.Ready, "")
	// Our own report is on the stream we read: take it at once, so that a
	// restarted status server does not show itself failed.
	for _, h := range s.in.Health.Take() {
		s.healths[h.Service] = h
	}
	s.update()
}

// stateLoop owns the health map (after catchUp, in the same goroutine): it folds Health events, Envoy's state and
// the tree into a readiness verdict, until ctx is done or serving fails.
func (s *Service) stateLoop(ctx context.Context, served <-chan error) error {
	for {
		_, _, envoyChanged := s.in.Envoy.Watch()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-served:
			return fmt.Errorf("status server stopped serving: %w", err)
		case <-s.in.Health.Ready():
			for _, h := range s.in.Health.Take() {
				s.healths[h.Service] = h
			}
		case <-envoyChanged:
		}
		s.update()
	}
}

// update recomputes the verdict, publishes it for the handlers and for the
// tree (systemd READY=1).
func (s *Service) update() {
	ready, reason := s.readiness()
	snapshot := make(map[string]messages.Health, len(s.healths))
	for k, v := range s.healths {
		snapshot[k] = v
	}
	if ready && !s.startupRecorded {
		s.recordStartup() // before the handlers can answer 200
	}
	prev := s.view.Swap(&view{ready: ready, reason: reason, healths: snapshot})
	if prev.ready != ready || prev.reason != reason {
		s.out.Readiness.Send(messages.Readiness{Ready: ready, Reason: reason})
	}
}

// recordStartup sets startup_duration_seconds once, when /healthz/ready
// first answers 200. Istio records it when a readiness probe first finds
// Envoy ready (ready/probe.go), so its value depends on kubelet's probe
// period; this one is the moment the verdict changed. Later returns to
// ready (after an Envoy restart) are not a start-up and leave it alone.
func (s *Service) recordStartup() {
	s.startupRecorded = true
	took := s.clock.Now().Sub(s.startedAt)
	s.startup.WithLabelValues().Set(took.Seconds())
	s.log.Info("agent ready", "startup_duration", took.Round(time.Millisecond))
}

// readiness is the verdict of /healthz/ready: every reason it is not ready.
func (s *Service) readiness() (bool, string) {
	var why []string
	if h, ok := s.healths[messages.AgentService]; ok && !h.State.Serving() {
		why = append(why, "agent: "+describe(h))
	}
	required := append([]string(nil), s.in.Required...)
	sort.Strings(required)
	for _, name := range required {
		h, ok := s.healths[name]
		switch {
		case !ok:
			why = append(why, name+": no report yet")
		case !h.State.Serving():
			why = append(why, name+": "+describe(h))
		}
	}
	if s.in.RequireEnvoy {
		st, ok := s.in.Envoy.Get()
		switch {
		case !ok || !st.Phase.Alive():
			reason := "envoy: not running" + exitSuffix(st)
			if h, ok := s.healths[messages.EnvoyService]; ok && h.State == messages.Failed {
				// Why it cannot start (a bad binary, a bootstrap error).
				reason += ": " + h.Reason
			}
			why = append(why, reason)
		case st.Phase == messages.EnvoyDraining:
			why = append(why, "envoy: draining")
		case st.Phase != messages.EnvoyReady:
			reason := "envoy: not ready"
			if st.NotReady != "" {
				reason += " (" + st.NotReady + ")"
			}
			why = append(why, reason)
		}
	}
	if len(why) > 0 {
		return false, strings.Join(why, "; ")
	}
	return true, ""
}

func describe(h messages.Health) string {
	if h.Reason == "" {
		return h.State.String()
	}
	return h.State.String() + " (" + h.Reason + ")"
}

func exitSuffix(st messages.EnvoyState) string {
	if st.ExitReason == "" {
		return ""
	}
	return " (last exit: " + st.ExitReason + ")"
}

// closeIdleConnections ends the connections kept to the application and
// the metrics sources once the server has stopped.
func (s *Service) closeIdleConnections() {
	s.prober.CloseIdleConnections()
	s.metrics.CloseIdleConnections()
}
