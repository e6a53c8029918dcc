package tree

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"time"

	"github.com/thejerf/suture/v4"

	"github.com/meshagent/meshagent/messages"
)

// ErrChaosKill is the failure a runner reports when /debug/chaos/kill made
// its service fail.
var ErrChaosKill = errors.New("killed by chaos request")

// ErrUnexpectedReturn is the failure of a service whose Serve returned nil
// while the agent was running: services run until stopped.
var ErrUnexpectedReturn = errors.New("service returned without being stopped")

// runner wraps one service (or subtree) with the restart policy suture lacks:
// a jittered, growing delay before each restart, reset after a healthy run,
// panics turned into failures with their stack, chaos kills, and the give-up
// limit. Serve is exclusive (see enter): everything below the "touched only
// by Serve" line belongs to one goroutine at a time.
type runner struct {
	name    string // the service's name, as in logs, metrics, Health
	path    string // its place in the tree, "names/dns"
	service suture.Service
	policy  Policy
	clock   messages.Clock
	reg     *registry
	// health is the service's own reporter: the runner speaks for the
	// service when it has failed or stopped.
	health  *messages.Reporter
	metrics *metrics
	log     *slog.Logger
	// giveUp tells the agent to exit; it is called at most once.
	giveUp func(*GiveUpError)
	// stopTimeout is how long the service has to return once cancelled
	// (its supervisor's timeout, set by the tree once its parent is built),
	// for the report when it overruns.
	stopTimeout time.Duration

	// mu guards inServe, which is closed when the run inside Serve returns
	// (nil: no run), and cancelRun, which ends the service's current run
	// (nil while the service is not running: in backoff, say).
	mu        sync.Mutex
	inServe   chan struct{}
	cancelRun context.CancelCauseFunc
	// holdUntil keeps the service down after a chaos kill with a hold
	// (/debug/chaos/kill?for=): the next run waits at least until then.
	holdUntil time.Time

	// touched only by Serve
	rng         *rand.Rand
	consecutive int         // failures since the last healthy run
	failures    []time.Time // failure times inside the give-up window
	nextDelay   time.Duration
}

func newRunner(name, path string, svc suture.Service, p Policy, health *messages.Reporter, env *runtimeEnv) *runner {
	return &runner{
		name: name, path: path, service: svc, policy: p,
		clock: env.clock, reg: env.registry, health: health, metrics: env.metrics,
		log: env.log.With("service", name), giveUp: env.giveUp,
		rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
}

func (r *runner) String() string { return r.name }

// Serve waits out the backoff owed by the previous failure, runs the
// service, and classifies how it ended.
func (r *runner) Serve(ctx context.Context) error {
	leave, err := r.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	// The backoff is owed once, by the run after the failure: a run that
	// starts because its group was rebuilt (a group kill)
	// waits only what is left of it, and nothing once it has been waited.
	if r.nextDelay > 0 {
		began := r.clock.Now()
		select {
		case <-r.clock.After(r.nextDelay):
		case <-ctx.Done():
			r.nextDelay = max(r.nextDelay-r.clock.Now().Sub(began), 0)
			return ctx.Err()
		}
		r.nextDelay = 0
	}
	// The run can be killed from the moment the tree shows it starting:
	// status accepts a chaos kill for a starting service.
	runCtx, cancel := context.WithCancelCause(ctx)
	r.setRun(cancel)
	r.reg.update(r.path, func(n *messages.ServiceInfo) {
		n.State, n.Reason, n.NextDelay = messages.Starting, "", 0
	})
	started := r.clock.Now()
	err, panicked := r.serveRecovering(runCtx)
	r.setRun(nil)
	killed := errors.Is(context.Cause(runCtx), ErrChaosKill)
	cancel(nil)

	switch {
	case ctx.Err() != nil && !panicked:
		r.reg.update(r.path, func(n *messages.ServiceInfo) { n.State, n.Reason = messages.Stopped, "" })
		r.sendHealth(messages.Stopped, "stopped")
		return ctx.Err()
	case killed && !panicked:
		err = fmt.Errorf("%w (service returned: %v)", ErrChaosKill, err)
	case errors.Is(err, suture.ErrDoNotRestart):
		// A one-shot service that finished: keep the health it reported.
		r.reg.update(r.path, func(n *messages.ServiceInfo) { n.State, n.Reason = messages.Stopped, "done" })
		return err
	case errors.Is(err, suture.ErrTerminateSupervisorTree):
		return err
	case errors.Is(err, messages.ErrRestart):
		r.nextDelay = 0
		r.metrics.restarts.WithLabelValues(r.name).Inc()
		r.reg.update(r.path, func(n *messages.ServiceInfo) { n.Restarts++; n.Reason = err.Error() })
		r.log.Info("service restarting on request", "reason", err)
		return err
	case err == nil:
		err = ErrUnexpectedReturn
	}
	return r.failed(err, started, panicked)
}

// enter makes Serve exclusive: a second entry waits until the run inside
// has returned (or ctx is done). suture abandons a child that overruns its
// stop timeout, and a subtree rebuilt meanwhile adds the same runner to its
// fresh supervisor, which calls Serve again at once. Running the service
// then would break suture's contract (a stopped service is not served
// again) and give two runs the state below the "touched only by Serve" line.
// The wait is reported: the service is Failed, named in readiness and in
// /debug/tree, until its old run returns and the new one starts.
func (r *runner) enter(ctx context.Context) (leave func(), err error) {
	reported := false
	for {
		r.mu.Lock()
		prev := r.inServe
		if prev == nil {
			done := make(chan struct{})
			r.inServe = done
			r.mu.Unlock()
			if reported {
				r.log.Info("previous run has returned; running the service again")
			}
			return func() {
				r.mu.Lock()
				r.inServe = nil
				r.mu.Unlock()
				close(done)
			}, nil
		}
		r.mu.Unlock()
		if !reported {
			reported = true
			const why = "previous run has not returned (it ignored cancellation); not running it again until it does"
			r.reg.update(r.path, func(n *messages.ServiceInfo) { n.State, n.Reason = messages.Failed, why })
			r.sendHealth(messages.Failed, why)
			r.log.Error("service asked to run while its previous run is still inside Serve; waiting for it")
		}
		select {
		case <-prev:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// stopTimedOut records that the service overran its stop timeout. It runs
// on a supervisor's goroutine (the event hook): it must not block, and it
// touches nothing that belongs to Serve.
func (r *runner) stopTimedOut(supervisor string) {
	why := fmt.Sprintf("did not stop within %s of being cancelled (it ignores cancellation); its run may still be inside Serve", r.stopTimeout)
	r.metrics.stopTimeouts.WithLabelValues(r.name).Inc()
	r.reg.update(r.path, func(n *messages.ServiceInfo) {
		n.State, n.Reason, n.LastError = messages.Failed, "did not stop", why
		n.StopTimeouts++
	})
	r.sendHealth(messages.Failed, why)
	r.log.Error("service did not stop in time", "supervisor", supervisor, "stop_timeout", r.stopTimeout)
}

// failed records a failure, decides whether to give up, and sets the delay
// before the next run.
func (r *runner) failed(err error, started time.Time, panicked bool) error {
	now := r.clock.Now()
	if now.Sub(started) >= r.policy.HealthyAfter {
		r.consecutive = 0
	}
	r.consecutive++
	if panicked {
		r.metrics.panics.WithLabelValues(r.name).Inc()
	}

	if g := r.policy.GiveUp; g != nil {
		kept := r.failures[:0]
		for _, t := range r.failures {
			if now.Sub(t) < g.Window {
				kept = append(kept, t)
			}
		}
		r.failures = append(kept, now)
		if len(r.failures) > g.Restarts {
			gu := &GiveUpError{Service: r.name, Failures: len(r.failures), Window: g.Window, Err: err}
			r.metrics.giveUps.WithLabelValues(r.name).Inc()
			r.reg.update(r.path, func(n *messages.ServiceInfo) {
				n.State, n.Reason, n.LastError, n.Failures = messages.Failed, "gave up", err.Error(), r.consecutive
			})
			r.sendHealth(messages.Failed, gu.Error())
			r.log.Error("service failed too often; the agent gives up", "failures", len(r.failures),
				"window", g.Window, "error", err)
			r.giveUp(gu)
			return suture.ErrDoNotRestart
		}
	}

	r.nextDelay = r.policy.delay(r.consecutive, r.rng)
	reason := "restarting"
	if held := r.takeHold(now); held > r.nextDelay {
		r.nextDelay, reason = held, "held down by chaos request"
	}
	// The tree's state first, then the counter: whoever sees the restart
	// counted (a chaos suite polling the metric) finds the tree updated.
	r.reg.update(r.path, func(n *messages.ServiceInfo) {
		n.State, n.Reason, n.LastError = messages.Failed, reason, err.Error()
		n.Restarts++
		n.Failures = r.consecutive
		n.NextDelay = r.nextDelay
		if panicked {
			n.Panics++
		}
	})
	r.metrics.restarts.WithLabelValues(r.name).Inc()
	r.sendHealth(messages.Failed, err.Error())
	r.log.Warn("service failed; restarting", "attempt", r.consecutive, "next_delay", r.nextDelay, "error", err)
	return err
}

// serveRecovering runs the service and turns a panic into an error that
// carries the stack, so that the restart is ours (with backoff) and the
// panic is counted where the service is named.
func (r *runner) serveRecovering(ctx context.Context) (err error, panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			stack := debug.Stack()
			r.log.Error("service panicked", "panic", fmt.Sprint(p), "stack", string(stack))
			err, panicked = fmt.Errorf("panic: %v", p), true
		}
	}()
	return r.service.Serve(ctx), false
}

// setRun records how to end the service's current run (nil: none).
func (r *runner) setRun(cancel context.CancelCauseFunc) {
	r.mu.Lock()
	r.cancelRun = cancel
	r.mu.Unlock()
}

// kill makes the service's current run fail with ErrChaosKill
// (/debug/chaos/kill); with hold > 0 the next run waits at least that long,
// so a chaos suite can take a peer down "for a while". A kill while the
// service is not running (in backoff) applies to no run and is ignored.
func (r *runner) kill(hold time.Duration) {
	r.mu.Lock()
	cancel := r.cancelRun
	if cancel != nil && hold > 0 {
		r.holdUntil = r.clock.Now().Add(hold)
	}
	r.mu.Unlock()
	if cancel == nil {
		r.log.Warn("chaos: kill arrived while the service was not running; ignored")
		return
	}
	r.log.Warn("chaos: killing service", "hold", hold)
	cancel(ErrChaosKill)
}

// takeHold returns how much of a chaos hold is left at now, and clears it.
func (r *runner) takeHold(now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	left := r.holdUntil.Sub(now)
	r.holdUntil = time.Time{}
	return max(left, 0)
}

func (r *runner) sendHealth(state messages.HealthState, reason string) {
	r.health.Report(state, reason)
}

// GiveUpError is the agent's exit error when a service failed more often
// than its restart limit allows.
type GiveUpError struct {
	Service  string
	Failures int
	Window   time.Duration
	Err      error // the last failure
}

func (e *GiveUpError) Error() string {
	return fmt.Sprintf("%s failed %d times within %s, giving up; last error: %v", e.Service, e.Failures, e.Window, e.Err)
}

func (e *GiveUpError) Unwrap() error { return e.Err }
