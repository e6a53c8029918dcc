package envoy

import (
	"context"
	"time"

	"github.com/meshagent/meshagent/messages"
)

// drainState is where a run is in draining Envoy. The run loop reads it to
// tell an exit drain's end from a failure, and handleDrain to tell what a
// further Drain command means.
type drainState int

const (
	// notDrained: Envoy serves.
	notDrained drainState = iota
	// drainedRunning: drained without Exit (Istio's POST /drain); Envoy
	// keeps running until told to exit, and then stops at once.
	drainedRunning
	// exitDraining: an exit drain is under way (run.exit); the loop stops
	// Envoy when it is over.
	exitDraining
)

// exitDrain is an exit drain under way. Its channels are nil, so the run
// loop never selects them, until handleDrain starts one.
type exitDrain struct {
	reason   string
	deadline time.Time
	expired  <-chan time.Time // fires at deadline
	// check fires for the next look at the active connections: after the
	// minimum drain duration, then every poll interval; nil without
	// ExitOnZeroActiveConnections.
	check    <-chan time.Time
	failures int // consecutive failures to read the active connections
}

// handleDrain carries out one Drain command. It returns nil when Envoy keeps
// running (a drain without Exit, or an exit drain now under way, which the
// run loop ends), or the error Serve must return.
func (r *run) handleDrain(ctx context.Context, d messages.Drain) error {
	log := r.s.log.With("reason", d.Reason, "exit", d.Exit, "immediate", d.Immediate)
	// A hot restart not yet taken over is given up: what drains and stops
	// is what serves (#25).
	r.abandonHotRestart("drain: " + d.Reason)
	switch {
	case d.Immediate:
		log.Info("stopping envoy without draining")
		r.stop("stopped without draining: " + d.Reason)
		return errDrained("immediate")
	case r.drain == exitDraining:
		// The exit drain under way keeps its deadline; only an immediate
		// stop cuts it short.
		log.Info("envoy already draining to exit")
		return nil
	case r.drain == drainedRunning:
		// Istio: after POST /drain, SIGTERM exits at once.
		if !d.Exit {
			log.Info("envoy already drained")
			return nil
		}
		log.Info("envoy already drained; stopping it")
		r.stop("drained: " + d.Reason)
		return errDrained("already drained")
	}

	r.state.Phase = messages.EnvoyDraining
	r.publish()
	r.s.setHealth(messages.Starting, "draining: "+d.Reason)
	r.postDrainListeners(ctx, !d.Exit)
	if !d.Exit {
		// Istio's POST /drain: drain, keep running until told to exit.
		log.Info("envoy draining; it keeps running until told to exit")
		r.drain = drainedRunning
		return nil
	}

	clock := r.s.clock
	deadline := d.Deadline
	if deadline.IsZero() {
		deadline = clock.Now().Add(r.s.cfg.TerminationDrainDuration)
	}
	log.Info("draining envoy", "until", deadline, "exit_on_zero_active_connections", r.s.cfg.ExitOnZeroActiveConnections)
	r.drain = exitDraining
	r.exit = exitDrain{reason: d.Reason, deadline: deadline, expired: clock.After(max(0, deadline.Sub(clock.Now())))}
	if r.s.cfg.ExitOnZeroActiveConnections {
		r.exit.check = clock.After(r.s.cfg.MinimumDrainDuration)
	}
	return nil
}

// drainOver stops Envoy at the end of an exit drain.
func (r *run) drainOver() error {
	r.stop("drained: " + r.exit.reason)
	return errDrained("drained")
}

// connectionsGone looks at Envoy's active connections during an exit drain
// with ExitOnZeroActiveConnections: it says whether the drain is over (none
// left, none counted, or the count unreadable 5 times in a row), and
// otherwise schedules the next look.
func (r *run) connectionsGone(ctx context.Context) bool {
	clock := r.s.clock
	timeout := min(2*time.Second, max(time.Millisecond, r.exit.deadline.Sub(clock.Now())))
	n, err := r.s.admin.activeConnections(ctx, r.s.cfg.ExcludedListeners, timeout)
	switch {
	case err != nil:
		r.exit.failures++
		r.s.log.Warn("reading active connections", "error", err, "attempt", r.exit.failures)
		if r.exit.failures > 4 {
			r.s.log.Warn("giving up waiting for active connections after 5 errors")
			return true
		}
	case n < 0:
		r.s.log.Info("envoy reports no downstream_cx_active stats; not waiting for connections")
		return true
	case n == 0:
		r.s.log.Info("no more active connections")
		return true
	default:
		r.exit.failures = 0
		r.s.log.Info("waiting for active connections to end", "active", n)
	}
	r.exit.check = clock.After(activeConnectionsPollInterval)
	return false
}

// postDrainListeners asks Envoy to drain (skipExit: and keep running). An
// Envoy that has only just started may not answer yet: try for about a
// second. On failure, go on as Istio does: the drain period still lets
// connections finish.
func (r *run) postDrainListeners(ctx context.Context, skipExit bool) {
	const attempts = 10
	for i := 1; ; i++ {
		err := r.s.admin.drainListeners(ctx, r.s.cfg.DrainQuery, skipExit)
		if err == nil {
			return
		}
		if i == attempts {
			r.s.log.Warn("drain_listeners failed", "error", err, "attempts", i)
			return
		}
		select {
		case <-r.child.done:
			return
		case <-ctx.Done():
			return
		case <-r.s.clock.After(100 * time.Millisecond):
		}
	}
}
