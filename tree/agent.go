package tree

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/thejerf/suture/v4"

	"github.com/meshagent/meshagent/messages"
)

// AgentService is the name under which the tree itself reports Health (the
// status server is ready only while the agent is not shutting down).
const AgentService = messages.AgentService

// EnvoyService is the name of the service that runs Envoy; shutdown drains
// it before stopping the rest.
const EnvoyService = messages.EnvoyService

// Node is one entry of the tree: a service (Service set) or a group of
// nodes under a supervisor of their own (Children set).
type Node struct {
	// Name is a group's name. A service's name is its String(): the one
	// name its Health, metrics, logs and /debug/tree use. If Name is set
	// for a service it must match.
	Name    string
	Service Service
	// Health is the reporter the service was built with (its Runtime's);
	// the runner reports the service's failures and stops through it, so
	// that repeats are judged across restarts. Nil: the runner makes one.
	Health   *messages.Reporter
	Children []Node
	// Policy overrides the agent's default restart policy for this node.
	Policy *Policy
}

// Service is what the tree runs: a suture service that names itself.
type Service interface {
	suture.Service
	String() string
}

// Options tune the tree; zero values take the defaults.
type Options struct {
	Clock         messages.Clock
	DefaultPolicy *Policy
	// StopTimeout bounds how long one service may take to stop once
	// cancelled (suture's Timeout); default 10s. A service that overruns
	// it is reported and abandoned, and not run again until its old Serve
	// returns; a group's parent waits groupStopMargin longer than the group.
	StopTimeout time.Duration
	// DrainTimeout bounds how long a graceful shutdown waits for Envoy to
	// drain and stop before stopping the rest; default 1m.
	DrainTimeout time.Duration
	// Notifier speaks to systemd; nil does nothing.
	Notifier Notifier
	// OnFirstReady runs once, on the tree's goroutine, when the agent is
	// first ready: process policy that is cmd's, not the tree's (issue 26;
	// the agent returns its start-up memory there). Nil: nothing.
	OnFirstReady func()
}

// Agent is a built supervision tree, ready to Run once.
type Agent struct {
	ch       *Channels
	opts     Options
	log      *slog.Logger
	root     *suture.Supervisor
	runners  map[string]*runner
	hasEnvoy bool
	giveUps  chan *GiveUpError
	// health reports the agent itself (AgentService).
	health *messages.Reporter
}

// runtimeEnv is what every runner shares.
type runtimeEnv struct {
	clock    messages.Clock
	registry *registry
	health   messages.Sink[messages.Health]
	metrics  *metrics
	log      *slog.Logger
	giveUp   func(*GiveUpError)
}

// New builds the tree from nodes. Names must be unique across the tree:
// they are how Health, metrics, chaos and /debug/tree address a service.
func New(ch *Channels, nodes []Node, reg prometheus.Registerer, log *slog.Logger, opts Options) (*Agent, error) {
	if opts.Clock == nil {
		opts.Clock = messages.SystemClock{}
	}
	if opts.DefaultPolicy == nil {
		p := DefaultPolicy()
		opts.DefaultPolicy = &p
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 10 * time.Second
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = time.Minute
	}
	if opts.Notifier == nil {
		opts.Notifier = nopNotifier{}
	}
	m, err := newMetrics(reg, ch.Health.Dropped)
	if err != nil {
		return nil, fmt.Errorf("registering tree metrics: %w", err)
	}
	a := &Agent{
		ch: ch, opts: opts, log: log,
		runners: map[string]*runner{},
		giveUps: make(chan *GiveUpError, 1),
		health:  messages.NewReporter(AgentService, ch.Health, opts.Clock),
	}
	env := &runtimeEnv{
		clock:    opts.Clock,
		registry: newRegistry(ch.Tree, opts.Clock),
		health:   ch.Health,
		metrics:  m,
		log:      log,
		giveUp: func(g *GiveUpError) {
			select {
			case a.giveUps <- g:
			default: // the agent is already giving up
			}
		},
	}
	spec := suture.Spec{
		EventHook: eventHook(log, a.runnerOf, m),
		// Restart pacing is the runners' job: keep suture's own
		// supervisor-wide backoff out of the way.
		FailureThreshold:         1e9,
		FailureDecay:             1,
		DontPropagateTermination: true,
	}
	var children []*runner
	height := 0
	for _, n := range nodes {
		r, h, err := a.build(n, "", env, spec)
		if err != nil {
			return nil, err
		}
		children = append(children, r)
		height = max(height, h)
	}
	a.root = suture.New("meshagent", a.supervisorSpec(spec, height, children))
	for _, r := range children {
		a.root.Add(r)
	}
	return a, nil
}

// groupStopMargin is how much longer a supervisor waits for a group to stop
// than the group waits for its own children. When a service ignores
// cancellation, its own supervisor's timeout fires first, so the report
// (log, meshagent_service_stop_timeouts_total, /debug/tree) names the
// service that hung rather than every group around it. Shutdown is bounded
// by the root's timeout: StopTimeout plus this margin per level of groups.
const groupStopMargin = time.Second

// supervisorSpec is the spec of a supervisor whose tallest child has the
// given height (0: only services), and tells each child its stop timeout.
func (a *Agent) supervisorSpec(spec suture.Spec, height int, children []*runner) suture.Spec {
	spec.Timeout = a.opts.StopTimeout + time.Duration(height)*groupStopMargin
	for _, r := range children {
		r.stopTimeout = spec.Timeout
	}
	return spec
}

// build makes the runner of node n (and of its children) and returns it
// with the node's height: 0 for a service, 1 + its tallest child's for a
// group.
func (a *Agent) build(n Node, parent string, env *runtimeEnv, spec suture.Spec) (*runner, int, error) {
	if n.Service != nil {
		name := n.Service.String()
		switch {
		case n.Name != "" && n.Name != name:
			return nil, 0, fmt.Errorf("tree node %q holds service %q: a service's node is named by its String()", n.Name, name)
		case n.Health != nil && n.Health.Name() != name:
			// Readiness would wait forever for a name nobody reports.
			return nil, 0, fmt.Errorf("service %q reports its health as %q", name, n.Health.Name())
		}
		n.Name = name
	}
	if n.Name == "" {
		return nil, 0, errors.New("tree node without a name")
	}
	if _, dup := a.runners[n.Name]; dup || n.Name == AgentService {
		return nil, 0, fmt.Errorf("tree node name %q is used twice", n.Name)
	}
	if (n.Service == nil) == (len(n.Children) == 0) {
		return nil, 0, fmt.Errorf("tree node %q must have either a service or children", n.Name)
	}
	policy := *a.opts.DefaultPolicy
	if n.Policy != nil {
		policy = *n.Policy
	}
	if err := policy.Validate(); err != nil {
		return nil, 0, fmt.Errorf("restart policy of %s: %w", n.Name, err)
	}
	path := n.Name
	if parent != "" {
		path = parent + "/" + n.Name
	}
	kind := "service"
	if n.Service == nil {
		kind = "supervisor"
	}
	env.registry.add(path, n.Name, kind)

	svc, height := n.Service, 0
	if svc == nil {
		st := &subtree{name: n.Name}
		for _, c := range n.Children {
			cr, h, err := a.build(c, path, env, spec)
			if err != nil {
				return nil, 0, err
			}
			st.children = append(st.children, cr)
			height = max(height, h)
		}
		st.spec = a.supervisorSpec(spec, height, st.children)
		height++
		svc = st
	}
	health := n.Health
	if health == nil {
		health = messages.NewReporter(n.Name, env.health, env.clock)
	}
	r := newRunner(n.Name, path, svc, policy, health, env)
	a.runners[n.Name] = r
	if n.Name == EnvoyService {
		a.hasEnvoy = true
	}
	return r, height, nil
}

// Run serves the tree until ctx is done, a Shutdown arrives, or a service
// gives up. A graceful stop drains Envoy first and returns nil; a give-up
// returns the *GiveUpError.
func (a *Agent) Run(ctx context.Context) error {
	// The services run under a context of their own, cancelled only after
	// Envoy has drained: ordered shutdown is explicit (suture cancels all
	// children at once).
	rootCtx, cancelRoot := context.WithCancel(context.Background())
	defer cancelRoot()
	done := a.root.ServeBackground(rootCtx)
	a.agentHealth(messages.Ready, "")

	watchdog := a.newWatchdog()
	notifiedReady := false
	var giveUp *GiveUpError
	graceful, reason := true, ""

loop:
	for {
		readiness, _, readinessChanged := a.ch.Readiness.Watch()
		if readiness.Ready && !notifiedReady {
			notifiedReady = true
			a.notify("READY=1")
			if a.opts.OnFirstReady != nil {
				a.opts.OnFirstReady()
			}
		}
		select {
		case <-ctx.Done():
			reason = "agent stopped"
			break loop
		case <-a.ch.Shutdown.Ready():
			for _, s := range a.ch.Shutdown.Take() {
				reason = s.Reason
				graceful = graceful && s.Graceful
			}
			break loop
		case <-a.ch.Chaos.Ready():
			for _, c := range a.ch.Chaos.Take() {
				a.chaos(c)
			}
		case giveUp = <-a.giveUps:
			graceful, reason = false, giveUp.Error()
			break loop
		case err := <-done:
			return fmt.Errorf("supervision tree stopped unexpectedly: %w", err)
		case <-readinessChanged:
		case <-watchdog.due():
			watchdog.ping()
		}
	}

	a.log.Info("shutting down", "reason", reason, "graceful", graceful)
	a.agentHealth(messages.Stopped, "shutting down: "+reason)
	a.notify("STOPPING=1")
	if graceful {
		a.drainEnvoy(reason, watchdog)
	}
	cancelRoot()
	<-done
	if giveUp != nil {
		return giveUp
	}
	return nil
}

// drainEnvoy asks the envoy service to drain and stop Envoy, and waits
// until it has, or DrainTimeout passes. A Shutdown that arrives meanwhile
// and is not graceful (a second signal) turns the drain into a stop now.
func (a *Agent) drainEnvoy(reason string, watchdog *watchdog) {
	if !a.hasEnvoy {
		return
	}
	if st, ok := a.ch.Envoy.Get(); !ok || !st.Phase.Alive() {
		return
	}
	a.ch.Drain.Send(messages.Drain{Reason: reason, Exit: true})
	timeout := a.opts.Clock.After(a.opts.DrainTimeout)
	for {
		st, _, changed := a.ch.Envoy.Watch()
		if !st.Phase.Alive() {
			return
		}
		select {
		case <-changed:
		case <-a.ch.Shutdown.Ready():
			for _, s := range a.ch.Shutdown.Take() {
				if !s.Graceful {
					a.log.Warn("stopping Envoy without finishing the drain", "reason", s.Reason)
					a.ch.Drain.Send(messages.Drain{Reason: s.Reason, Exit: true, Immediate: true})
				}
			}
		case <-watchdog.due():
			watchdog.ping()
		case <-timeout:
			a.log.Warn("Envoy did not finish draining in time; stopping the agent", "timeout", a.opts.DrainTimeout)
			return
		}
	}
}

func (a *Agent) chaos(c messages.Chaos) {
	r, ok := a.runners[c.Service]
	if !ok {
		a.log.Warn("chaos: no such service", "service", c.Service)
		return
	}
	r.kill(c.For)
}

func (a *Agent) agentHealth(state messages.HealthState, reason string) {
	a.health.Report(state, reason)
}

// runnerOf is the runner of the service named name (nil if none): the
// event hook reports a service that overran its stop timeout through it.
// The runners map is complete before the tree runs and never changes after.
func (a *Agent) runnerOf(name string) *runner {
	return a.runners[name]
}

func (a *Agent) notify(state string) {
	if err := a.opts.Notifier.Notify(state); err != nil {
		a.log.Warn("systemd notify failed", "state", state, "error", err)
	}
}

// watchdog pings systemd's watchdog at half its interval, on the agent's
// clock (issue 26: every wait of the tree goes through the one clock, so a
// test moves it by hand).
type watchdog struct {
	a    *Agent
	half time.Duration
	next <-chan time.Time // nil: no watchdog, never due
}

func (a *Agent) newWatchdog() *watchdog {
	w := &watchdog{a: a, half: a.opts.Notifier.WatchdogInterval() / 2}
	if w.half > 0 {
		w.next = a.opts.Clock.After(w.half)
	}
	return w
}

// due is the channel that receives when the next ping is due.
func (w *watchdog) due() <-chan time.Time { return w.next }

// ping tells systemd the agent's loop runs and arms the next ping.
func (w *watchdog) ping() {
	w.a.notify("WATCHDOG=1")
	w.next = w.a.opts.Clock.After(w.half)
}
