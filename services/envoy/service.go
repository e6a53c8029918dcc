package envoy

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/thejerf/suture/v4"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/envoy/bootstrap"
)

// prepare writes the bootstrap and returns Envoy's arguments.
func (s *Service) prepare() ([]string, error) {
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
	// AgentReady is the agent's readiness (status's verdict), which the
	// bootstrap's :15021 answers from while Envoy is ready (agentready.go,
	// #36); nil: every probe goes to the agent.
	AgentReady messages.Latest[messages.Readiness]
}

// Outputs are what the service publishes.
type Outputs struct {
	State messages.Sink[messages.EnvoyState]
}

// Service runs one Envoy process per Serve call.
type Service struct {
	cfg   Config
	drain messages.Source[messages.Drain]
	xds   messages.Latest[messages.XDSState]
	// agentReady is Inputs.AgentReady.
	agentReady messages.Latest[messages.Readiness]
	state      messages.Sink[messages.EnvoyState]
	health     *messages.Reporter
	clock      messages.Clock
	log        *slog.Logger
	admin      *adminClient
	// envoyAnswersProbe is 1 while the serving Envoy answers the kubelet's
	// readiness probe itself (the relay told it the agent is ready), 0
	// while it forwards each probe to the agent (agentready.go, #36).
	envoyAnswersProbe prometheus.Gauge

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
	// memoryUnknown says, once the memory cgroup could not be read for a
	// hot restart's memory check, that the check is off (#33).
	memoryUnknown string
}

// New validates cfg, once (Serve does not check it again), and returns the
// service.
func New(cfg Config, in Inputs, out Outputs, rt messages.Runtime) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	var mm messages.Metrics
	s := &Service{cfg: cfg, drain: in.Drain, xds: in.XDS, agentReady: in.AgentReady, state: out.State, health: rt.Health, clock: rt.Clock,
		log: rt.Log, admin: newAdminClient(cfg.AdminAddr),
		envoyAnswersProbe: mm.Gauge("envoy_answers_readiness_probe",
			"1 while Envoy answers the kubelet's readiness probe on its status port itself, the agent being ready; 0 while it forwards every probe to the agent.")}
	if err := rt.Register(mm.Collectors()...); err != nil {
		return nil, err
	}
	return s, nil
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

	r.relay = s.startRelay(ctx)
	r.relay.envoy(r.state) // later states come through publish
	r.poll = s.startPoller(ctx, child)
	// The relay and the poll stop before the admin client's kept-alive
	// connection is closed, so that neither opens another after it.
	defer func() { r.relay.stop(); r.poll.stop(); s.admin.closeIdle() }()
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
	// relay tells the serving Envoy the agent's readiness (agentready.go);
	// nil when the bootstrap does not read it.
	relay *readinessRelay
	hot   hotRun // a hot restart under way, and the watch of the inputs
	state messages.EnvoyState
	// envoyAnswers is what the relay last said: the serving Envoy answers
	// the kubelet's probe itself (the envoy line of /debug/tree says so).
	envoyAnswers bool
	// drain is how far Envoy is drained: a later exit or stop does not
	// drain again; exit holds the exit drain under way.
	drain drainState
	exit  exitDrain
}

func (r *run) publish() {
	r.s.last = r.state
	r.s.state.Send(r.state)
	r.relay.envoy(r.state)
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
				// one carries on alone (overlap.go).
				r.oldExitedFirst(ctx)
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
		case <-r.hot.nextDeadline:
			r.nextOverdue()
			r.afterOverlap(ctx)
		case dirs := <-r.hot.changes():
			r.inputsChanged(ctx, dirs)
		case err := <-r.hot.watchFailed():
			r.s.log.Error("watching envoy's inputs failed; hot restarts stop until envoy restarts", "error", err)
			r.hot.close()
		case v := <-r.hot.validated:
			r.validated(ctx, v)
		case a := <-r.relay.answered():
			r.envoyAnswers = a
			if h, _ := r.s.health.Last(); h.State == messages.Ready { // the reason changes, not the state
				r.s.setHealth(messages.Ready, r.overlapNote())
			}
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
	last := r.child.stderr.lastLine()
	r.s.log.Error("envoy exited", "pid", r.child.pid, "epoch", r.child.epoch, "status", reason, "last_line", last)
	health := err.Error()
	if last != "" {
		health += "; its last line: " + last
	}
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

// sendLatest puts v in ch, a channel of one value whose only sender is the
// caller, replacing a value not yet read: its reader wants the newest (the
// readiness poll's verdict, the relay's EnvoyState), and the sender never
// blocks.
func sendLatest[T any](ch chan T, v T) {
	select {
	case <-ch:
	default:
	}
	ch <- v
}
