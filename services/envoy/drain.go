package envoy

import (
	"context"
	"time"

	"github.com/meshagent/meshagent/messages"
)

// handleDrain carries out one Drain command. It returns nil when Envoy keeps
// running (a drain without Exit), or the error Serve must return.
func (r *run) handleDrain(ctx context.Context, d messages.Drain, ready <-chan readiness) error {
	log := r.s.log.With("reason", d.Reason, "exit", d.Exit, "immediate", d.Immediate)
	switch {
	case d.Immediate:
		log.Info("stopping envoy without draining")
		r.stop("stopped without draining: " + d.Reason)
		return errDrained("immediate")
	case r.drained:
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
		r.drained = true
		return nil
	}

	deadline := d.Deadline
	if deadline.IsZero() {
		deadline = r.s.clock.Now().Add(r.s.cfg.TerminationDrainDuration)
	}
	log.Info("draining envoy", "until", deadline, "exit_on_zero_active_connections", r.s.cfg.ExitOnZeroActiveConnections)
	if err := r.waitDrain(ctx, deadline, ready); err != nil {
		return err
	}
	r.drained = true
	r.stop("drained: " + d.Reason)
	return errDrained("drained")
}

// waitDrain waits until the drain is over: deadline reached, or (with
// ExitOnZeroActiveConnections) the minimum drain duration passed and no
// connection is active. It returns nil when Envoy should now be stopped, or
// the error Serve must return when Envoy exited, ctx ended, or an
// immediate Drain came meanwhile.
func (r *run) waitDrain(ctx context.Context, deadline time.Time, ready <-chan readiness) error {
	clock := r.s.clock
	expired := clock.After(max(0, deadline.Sub(clock.Now())))

	// With ExitOnZeroActiveConnections, the first check is after the
	// minimum drain duration, then one every second.
	var check <-chan time.Time
	if r.s.cfg.ExitOnZeroActiveConnections {
		check = clock.After(r.s.cfg.MinimumDrainDuration)
	}
	failures := 0
	for {
		select {
		case <-r.child.done:
			// Envoy left on its own during an exit drain: that is the
			// drain's end, not a failure.
			r.s.log.Info("envoy exited while draining")
			r.stop("exited while draining")
			return errDrained("exited while draining")
		case <-ctx.Done():
			r.stop("agent stopping")
			return ctx.Err()
		case v := <-ready:
			r.setReady(v)
		case <-r.drainReady():
			for _, d := range r.s.takeDrains() {
				if d.Immediate {
					r.s.log.Info("immediate stop during drain", "reason", d.Reason)
					r.stop("stopped without draining: " + d.Reason)
					return errDrained("immediate")
				}
			}
		case <-expired:
			r.s.log.Info("termination drain duration over")
			return nil
		case <-check:
			timeout := min(2*time.Second, max(time.Millisecond, deadline.Sub(clock.Now())))
			n, err := r.s.admin.activeConnections(ctx, r.s.cfg.ExcludedListeners, timeout)
			switch {
			case err != nil:
				failures++
				r.s.log.Warn("reading active connections", "error", err, "attempt", failures)
				if failures > 4 {
					r.s.log.Warn("giving up waiting for active connections after 5 errors")
					return nil
				}
			case n < 0:
				r.s.log.Info("envoy reports no downstream_cx_active stats; not waiting for connections")
				return nil
			case n == 0:
				r.s.log.Info("no more active connections")
				return nil
			default:
				failures = 0
				r.s.log.Info("waiting for active connections to end", "active", n)
			}
			check = clock.After(activeConnectionsPollInterval)
		}
	}
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
