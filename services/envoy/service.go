package envoy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/thejerf/suture/v4"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/envoy/bootstrap"
)

// The service's own operational defaults. Istio's values (binary path,
// admin port, drain durations, drain query) are not defaults here: cmd
// passes them explicitly, from its table of Istio's names.
const (
	// DefaultKillGrace is how long Envoy has to exit after SIGTERM before it
	// gets SIGKILL. Istio kills at once after the drain (Process.Kill); we
	// let Envoy flush its logs and close its sockets first.
	DefaultKillGrace = 5 * time.Second
	// DefaultReadyPollInterval is how often Envoy's readiness is polled
	// while it starts (the poll stops once Envoy is ready). Istio's agent
	// asks Envoy on every probe instead; at 100 ms ours reported ready up
	// to 100 ms after Envoy was (the end-to-end test on Istio's istiod),
	// at 20 ms 10 ms late on average, out of a start of about 100 (#24).
	// A local admin request every 5 ms for the first slowReadyPollAfter of
	// a start costs nothing; a start that takes longer (the control plane
	// is not there yet) is polled at slowReadyPollInterval.
	DefaultReadyPollInterval = 5 * time.Millisecond
	slowReadyPollAfter       = 2 * time.Second
	slowReadyPollInterval    = 20 * time.Millisecond
	// activeConnectionsPollInterval is Istio's activeConnectionCheckDelay.
	activeConnectionsPollInterval = time.Second
)

// Sentinel errors, checked with errors.Is.
var (
	// ErrEnvoyExited: Envoy exited without being asked to. The error Serve
	// returns is an *ExitError that carries the exit status.
	ErrEnvoyExited = errors.New("envoy exited")
	// ErrDrained: Envoy was drained (or stopped by an immediate Drain) and
	// stopped on purpose. Serve's error also wraps suture.ErrDoNotRestart.
	ErrDrained = errors.New("envoy drained and stopped")
	// ErrBinary: the Envoy binary is missing or cannot be executed.
	ErrBinary = errors.New("envoy binary unusable")
	// ErrPrepare: writing the bootstrap or making the arguments for a start
	// failed (the rendered bootstrap, or Config.Prepare in tests).
	ErrPrepare = errors.New("prepare envoy start")
	// ErrInvalidConfig: a Config field is invalid.
	ErrInvalidConfig = errors.New("invalid envoy config")
)

// Credential is the user and group Envoy runs as (Istio: uid/gid 1337 when
// the agent runs as root and DNS_PROXY_ADDR ends in ":53").
type Credential struct {
	UID, GID uint32
}

// Config is how to run Envoy. Every field is explicit, zero included
// (MinimumDrainDuration 0 means no minimum), except KillGrace,
// ReadyPollInterval, Stdout and Stderr, which take the defaults above.
type Config struct {
	// BinaryPath is Envoy's executable (ProxyConfig.binaryPath).
	BinaryPath string
	// Bootstrap and Args are Envoy's bootstrap and command line: the
	// bootstrap is rendered for the first start (bootstrap.Render) and
	// written again from the same bytes before a restart (render.go).
	Bootstrap *bootstrap.Config
	Args      ArgsConfig
	// Prepare, when set, replaces Bootstrap and Args: it writes a bootstrap
	// and returns Envoy's arguments (everything after the binary). Tests
	// use it to run Envoy on a hand-made bootstrap.
	Prepare func() ([]string, error)
	// AdminAddr is host:port of Envoy's admin API (ProxyConfig.proxyAdminPort).
	AdminAddr string
	// DrainQuery is the query of POST /drain_listeners: Istio's
	// "inboundonly&graceful" for a sidecar, "graceful" for a gateway. A
	// drain that keeps Envoy running (Istio's POST /drain) adds "&skip_exit".
	DrainQuery string
	// TerminationDrainDuration is how long a drain lasts
	// (ProxyConfig.terminationDrainDuration), unless Drain.Deadline says otherwise.
	TerminationDrainDuration time.Duration
	// MinimumDrainDuration is how long a drain lasts at least when
	// ExitOnZeroActiveConnections is set (MINIMUM_DRAIN_DURATION); 0 checks
	// the connections at once.
	MinimumDrainDuration time.Duration
	// ExitOnZeroActiveConnections ends a drain as soon as Envoy has no active
	// downstream connection (EXIT_ON_ZERO_ACTIVE_CONNECTIONS).
	ExitOnZeroActiveConnections bool
	// ExcludedListeners are the listener stat names (as in
	// "listener.<name>.downstream_cx_active") that do not count as active
	// connections: the agent's own listeners (bootstrap.Config.AgentListenerStats).
	ExcludedListeners []string
	// KillGrace is how long Envoy has after SIGTERM before SIGKILL.
	KillGrace time.Duration
	// ReadyPollInterval is how often admin /ready is polled.
	ReadyPollInterval time.Duration
	// RunAs, when not nil, is the uid/gid Envoy runs as; nil inherits ours.
	RunAs *Credential
	// Stdout and Stderr receive Envoy's output (default: ours).
	Stdout, Stderr io.Writer
	// Env is Envoy's environment; nil inherits the agent's.
	Env []string
	// CrashDir is where a record of each unexpected exit is kept, the last
	// MaxCrashRecords (crashes.go); empty keeps none.
	CrashDir string
	// HotRestart, when set, turns on Envoy hot restart (hotrestart.go,
	// #25); nil keeps Istio's --disable-hot-restart.
	HotRestart *HotRestartConfig
}

// withDefaults returns cfg with the operational defaults filled in.
func (cfg Config) withDefaults() Config {
	if cfg.KillGrace == 0 {
		cfg.KillGrace = DefaultKillGrace
	}
	if cfg.ReadyPollInterval == 0 {
		cfg.ReadyPollInterval = DefaultReadyPollInterval
	}
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	return cfg
}

// Validate reports every invalid field, by name and value, the bootstrap's
// included.
func (cfg Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if cfg.BinaryPath == "" {
		bad("BinaryPath is empty (ProxyConfig.binaryPath)")
	}
	if _, _, err := net.SplitHostPort(cfg.AdminAddr); err != nil {
		bad("AdminAddr %q: %v", cfg.AdminAddr, err)
	}
	if cfg.DrainQuery == "" {
		bad("DrainQuery is empty: want Istio's inboundonly&graceful (sidecar) or graceful (gateway)")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"TerminationDrainDuration", cfg.TerminationDrainDuration},
		{"MinimumDrainDuration", cfg.MinimumDrainDuration},
		{"KillGrace", cfg.KillGrace},
		{"ReadyPollInterval", cfg.ReadyPollInterval},
	} {
		if d.v < 0 {
			bad("%s %v is negative", d.name, d.v)
		}
	}
	if cfg.HotRestart != nil {
		errs = append(errs, cfg.HotRestart.validate())
	}
	if cfg.Prepare == nil {
		if cfg.Bootstrap == nil {
			bad("neither Bootstrap nor Prepare is set")
		} else {
			errs = append(errs, cfg.Bootstrap.Validate())
		}
	}
	return errors.Join(errs...)
}

// prepare writes the bootstrap and returns Envoy's arguments.
func (s *Service) prepare() ([]string, error) {
	if s.cfg.Prepare != nil {
		return s.cfg.Prepare()
	}
	r, err := s.cfg.render(s.bootstrap)
	if err != nil {
		return nil, err
	}
	s.bootstrap = r
	return CommandLine(s.cfg.Args, r.File), nil
}

// Name is the service's name in logs, metrics, Health and /debug/tree.
const Name = messages.EnvoyService

// Inputs are what the service reads.
type Inputs struct {
	// Drain brings drain and stop commands; nil: none.
	Drain messages.Source[messages.Drain]
	// XDS is the XDS proxy's state, for the versions a crash record names;
	// nil without an XDS proxy.
	XDS messages.Latest[messages.XDSState]
}

// Outputs are what the service publishes.
type Outputs struct {
	State messages.Sink[messages.EnvoyState]
}

// Service runs one Envoy process per Serve call.
type Service struct {
	cfg    Config
	drain  messages.Source[messages.Drain]
	xds    messages.Latest[messages.XDSState]
	state  messages.Sink[messages.EnvoyState]
	health *messages.Reporter
	clock  messages.Clock
	log    *slog.Logger
	admin  *adminClient

	// epoch is the Epoch of the next Envoy process and last the last
	// EnvoyState published; both survive Serve calls and are touched only
	// by Serve's goroutine.
	epoch int
	last  messages.EnvoyState
	// bootstrap is the bootstrap as first rendered (nil before the first
	// start); touched only by Serve's goroutine.
	bootstrap *bootstrap.Rendered
	// gen is what the serving Envoy was started from, with hot restart
	// on (nil otherwise); a hot restart replaces it, and cfg, when the new
	// epoch takes over. Touched only by Serve's goroutine.
	gen *generation
	// hotBlocked says why Envoy refuses hot restarts until its next cold
	// start ("" when it does not): an epoch that died before it took over
	// left Envoy's shared memory marked INITIALIZING, and every later
	// epoch of the base id fails on it ("previous envoy process is still
	// initializing") until an epoch 0 starts afresh.
	hotBlocked string
}

// New validates cfg, once (Serve does not check it again), and returns the
// service.
func New(cfg Config, in Inputs, out Outputs, rt messages.Runtime) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Service{cfg: cfg, drain: in.Drain, xds: in.XDS, state: out.State, health: rt.Health, clock: rt.Clock,
		log: rt.Log, admin: newAdminClient(cfg.AdminAddr)}, nil
}

// String names the service in logs, metrics and /debug/tree.
func (s *Service) String() string { return Name }

// Serve starts Envoy and runs until Envoy exits (an *ExitError wrapping
// ErrEnvoyExited), ctx is done (Envoy is stopped, ctx.Err()), or a Drain with
// Exit or Immediate has stopped it (ErrDrained and suture.ErrDoNotRestart).
// It never returns while Envoy runs.
func (s *Service) Serve(ctx context.Context) error {
	// A stop requested while Envoy was not running (between a crash and
	// the restart, say) is honoured without starting it again.
	pending := s.takeDrains()
	for _, d := range pending {
		if d.Exit || d.Immediate {
			s.log.Info("not starting envoy: a stop was requested", "reason", d.Reason)
			s.last.Phase = messages.EnvoyStopped
			s.state.Send(s.last)
			s.setHealth(messages.Stopped, "stop requested before start: "+d.Reason)
			return errDrained("stop requested before start")
		}
	}

	s.setHealth(messages.Starting, "starting envoy")
	child, err := s.start()
	if err != nil {
		s.setHealth(messages.Failed, err.Error())
		return err
	}
	r := &run{s: s, child: child, state: messages.EnvoyState{
		Phase: messages.EnvoyRunning, Epoch: child.epoch, PID: child.pid, Started: child.started,
		// Why the previous Envoy ended stays visible while this one starts.
		ExitCode: s.last.ExitCode, ExitReason: s.last.ExitReason,
	}}
	// Serve never returns, not even by a panic, while Envoy runs.
	defer r.ensureGone()
	r.publish()
	s.log.Info("envoy started", "pid", child.pid, "epoch", child.epoch, "binary", s.cfg.BinaryPath)

	r.poll = s.startPoller(ctx, child)
	defer func() { r.poll.stop(); s.admin.closeIdle() }()
	if err := r.watchInputs(); err != nil {
		r.stop("cannot watch envoy's inputs")
		return err
	}
	defer r.hot.close()

	for _, d := range pending { // drains without Exit, asked before the start
		if err := r.handleDrain(ctx, d); err != nil {
			return err
		}
	}
	return r.loop(ctx)
}

// takeDrains returns the waiting Drain commands, if there is a source.
func (s *Service) takeDrains() []messages.Drain {
	if s.drain == nil {
		return nil
	}
	return s.drain.Take()
}

// run is the state of one Serve call.
type run struct {
	s *Service
	// child is the Envoy that serves: during a hot restart, the old one
	// until the new one has taken over (epochs.go).
	child *child
	poll  *poller // the readiness poll of the newest Envoy
	hot   hotRun  // a hot restart under way, and the watch of the inputs
	state messages.EnvoyState
	// drain is how far Envoy is drained: a later exit or stop does not
	// drain again; exit holds the exit drain under way.
	drain drainState
	exit  exitDrain
}

func (r *run) publish() {
	r.s.last = r.state
	r.s.state.Send(r.state)
}

// ensureGone kills and reaps every Envoy that still runs: the last line
// of defence when Serve unwinds by a path that did not stop it (a panic).
func (r *run) ensureGone() {
	for _, c := range r.children() {
		select {
		case <-c.done:
		default:
			r.s.log.Error("envoy still running as Serve returns; killing it", "pid", c.pid)
			_ = c.cmd.Process.Signal(syscall.SIGKILL)
			<-c.done
		}
	}
}

// loop waits for Envoy's exit, a readiness change, a drain command, or ctx,
// and during an exit drain for its end: its deadline, or (with
// ExitOnZeroActiveConnections) no connection left. One loop for every
// drain state, so that each event has one answer, chosen by r.drain.
func (r *run) loop(ctx context.Context) error {
	for {
		select {
		case <-r.child.done:
			if r.hot.next != nil {
				// The old epoch died while the new one starts: the new
				// one carries on alone (epochs.go).
				r.oldExitedFirst()
				continue
			}
			if r.drain == exitDraining {
				// Envoy left on its own during an exit drain: that is
				// the drain's end, not a failure.
				r.s.log.Info("envoy exited while draining")
				r.stop("exited while draining")
				return errDrained("exited while draining")
			}
			return r.exited()
		case <-ctx.Done():
			r.stop("agent stopping")
			return ctx.Err()
		case v := <-r.poll.out:
			r.setReady(v)
			r.afterOverlap(ctx) // a change that came while Envoy started
		case <-r.hot.nextDone():
			r.nextFailed()
			r.afterOverlap(ctx)
		case <-r.hot.parentDone():
			r.parentExited()
			r.afterOverlap(ctx)
		case <-r.hot.parentDeadline:
			r.parentOverdue()
			r.afterOverlap(ctx)
		case dirs := <-r.hot.changes():
			r.inputsChanged(ctx, dirs)
		case err := <-r.hot.watchFailed():
			r.s.log.Error("watching envoy's inputs failed; hot restarts stop until envoy restarts", "error", err)
			r.hot.close()
		case v := <-r.hot.validated:
			r.validated(ctx, v)
		case <-r.drainReady():
			for _, d := range r.s.takeDrains() {
				if err := r.handleDrain(ctx, d); err != nil {
					return err
				}
			}
		case <-r.exit.expired:
			r.s.log.Info("termination drain duration over")
			return r.drainOver()
		case <-r.exit.check:
			if r.connectionsGone(ctx) {
				return r.drainOver()
			}
		}
	}
}

// drainReady is the drain source's Ready channel, or nil (never ready).
func (r *run) drainReady() <-chan struct{} {
	if r.s.drain == nil {
		return nil
	}
	return r.s.drain.Ready()
}

// setReady records the readiness poll's verdict: Running with the reason
// until Envoy is ready, then Ready. A draining Envoy stays draining
// whatever its admin API says.
func (r *run) setReady(v readiness) {
	if r.hot.next != nil {
		r.nextReadiness(v)
		return
	}
	if v.epoch != r.child.epoch || r.state.Phase == messages.EnvoyDraining {
		return
	}
	if v.ready {
		r.state.Phase, r.state.NotReady = messages.EnvoyReady, ""
		r.publish()
		r.s.setHealth(messages.Ready, r.overlapNote())
		return
	}
	if r.state.NotReady == v.why {
		return
	}
	r.state.Phase, r.state.NotReady = messages.EnvoyRunning, v.why
	r.publish()
	r.s.setHealth(messages.Starting, v.why)
}

// exited publishes Envoy's unexpected exit and returns the error for it.
// An old epoch still draining beside it is stopped: it no longer listens,
// and the next start is epoch 0 (#25).
func (r *run) exited() error {
	r.child.wait()
	r.stopOthers("the serving envoy exited")
	code, reason := r.child.exitStatus()
	r.state.Phase = messages.EnvoyExited
	r.state.ExitCode, r.state.ExitReason = code, reason
	r.publish()
	err := &ExitError{Epoch: r.child.epoch, PID: r.child.pid, ExitCode: code, Reason: reason}
	if reason == "signal: killed" {
		r.s.log.Warn("envoy was killed; it may have run out of memory", "pid", r.child.pid)
	}
	r.s.log.Error("envoy exited", "pid", r.child.pid, "epoch", r.child.epoch, "status", reason)
	health := err.Error()
	if path := r.s.keepCrashRecord(r.child, r.s.bootstrap); path != "" {
		health += "; crash record " + path
	}
	r.s.setHealth(messages.Failed, health)
	return err
}

// keepCrashRecord writes the record of c's unexpected exit, started on
// boot, and returns its path ("" when none is kept). Failing to write it is
// logged, never fatal.
func (s *Service) keepCrashRecord(c *child, boot *bootstrap.Rendered) string {
	if s.cfg.CrashDir == "" {
		return ""
	}
	var acked map[string]string
	if s.xds != nil {
		if st, ok := s.xds.Get(); ok {
			acked = maps.Clone(st.LastACK)
		}
	}
	rec := newCrashRecord(c, s.clock.Now(), acked, boot)
	path, err := writeCrashRecord(s.cfg.CrashDir, rec)
	if err != nil {
		s.log.Warn("keeping envoy's crash record", "dir", s.cfg.CrashDir, "error", err)
	}
	if path != "" && err == nil {
		s.log.Info("envoy crash record kept", "file", path, "stderr_tail_bytes", len(rec.StderrTail))
	}
	return path
}

// stop terminates Envoy (SIGTERM, SIGKILL after the grace period), waits for
// it and publishes Stopped.
func (r *run) stop(why string) {
	r.stopOthers(why)
	r.s.log.Info("stopping envoy", "pid", r.child.pid, "epoch", r.child.epoch, "reason", why)
	r.child.terminate(r.s.cfg.KillGrace, r.s.clock, r.s.log)
	code, reason := r.child.exitStatus()
	r.state.Phase = messages.EnvoyStopped
	r.state.ExitCode, r.state.ExitReason = code, reason
	r.publish()
	r.s.setHealth(messages.Stopped, why)
}

func (s *Service) setHealth(state messages.HealthState, reason string) {
	s.health.Report(state, reason)
}

// ExitError is Serve's error when Envoy exited on its own. It wraps
// ErrEnvoyExited.
type ExitError struct {
	Epoch, PID int
	// ExitCode is Envoy's exit status, -1 if a signal killed it.
	ExitCode int
	// Reason is how it ended: "exit status 1", "signal: killed", ...
	Reason string
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("envoy exited (pid %d, epoch %d): %s", e.PID, e.Epoch, e.Reason)
}

// Unwrap makes errors.Is(err, ErrEnvoyExited) true.
func (e *ExitError) Unwrap() error { return ErrEnvoyExited }

// errDrained is what Serve returns after a deliberate stop by a Drain.
func errDrained(why string) error {
	return fmt.Errorf("%w (%s): %w", ErrDrained, why, suture.ErrDoNotRestart)
}
