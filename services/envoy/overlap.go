package envoy

import (
	"context"
	"fmt"
	"strings"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/envoy/bootstrap"
)

// The ends of a hot restart's overlap (#25; epochs.go starts it): the new
// epoch late, failed, or left alone when the old one exits first; the old
// one's exit or overdue stop; a hot restart given up; and the note /debug/tree
// shows meanwhile. Each is a case of the run loop (service.go).

// nextOverdue stops a new epoch that was not ready within the take-over
// time (HotRestart.TakeOverTimeout: an Envoy waiting for ever on its
// configuration or a secret, with Istio's initial_fetch_timeout of 0): it
// is a failed epoch, and the
// old one keeps serving, as after a new epoch's crash (nextFailed), without
// the admin interface the new one had it close. Without this the two ran
// side by side until the next drain, and every change waited on them.
func (r *run) nextOverdue() {
	next := r.hot.next
	r.s.log.Warn("the new epoch did not turn ready in time; killing it",
		"new_epoch", next.restartEpoch, "pid", next.pid, "take_over_timeout", r.s.cfg.HotRestart.TakeOverTimeout)
	next.kill(r.s.log) // SIGTERM would be its shutdown, which ends the parent too
	r.nextFailed()
}

// nextFailed: the new epoch exited before it took over. The old one keeps
// serving, and the next try is numbered after it again.
func (r *run) nextFailed() {
	next, gen := r.hot.next, r.hot.nextGen
	next.wait()
	code, reason := next.exitStatus()
	r.hot.next, r.hot.nextGen, r.hot.nextDeadline = nil, nil, nil
	// The poll asked the dead epoch; the old Envoy was ready and still
	// is, and is not asked again: if the dead one had shut the old one's
	// admin down (Envoy's child does it first), a poll would say the old
	// one is not ready while it serves.
	r.poll.stop()
	r.s.restore(r.s.gen)
	r.state.Overlap = messages.EnvoyProcess{}
	r.publish()
	msg := "hot restart failed: the new epoch exited before taking over; the old one keeps serving"
	if path := r.s.keepCrashRecord(next, gen.rendered); path != "" {
		msg += "; crash record " + path
	}
	r.hot.refused = msg
	r.s.setHealth(messages.Ready, r.overlapNote())
	r.s.hotBlocked = fmt.Sprintf("epoch %d (pid %d) died before it took over (%s), leaving Envoy's shared memory marked initializing", next.restartEpoch, next.pid, reason)
	r.s.log.Error(msg, "outcome", "failed", "old_epoch", r.child.restartEpoch, "new_epoch", next.restartEpoch,
		"pid", next.pid, "exit_code", code, "status", reason, "reason", r.hot.reason)
}

// oldExitedFirst: the serving Envoy exited while the new epoch starts.
//
// An exit 0 is most likely the hot restart's end seen early: Envoy's child
// tells its parent to terminate parent_shutdown_time after its own workers
// started, i.e. once it was ready, and the readiness poll may not have
// seen that yet (a loaded machine; the poll's slow interval). Then the new
// epoch is asked once more, and ready, it takes over and the old one's
// exit ends the overlap: readiness never drops (TestHotRestartOldExitsBeforeThePollSeesTheNew).
//
// Otherwise the serving Envoy died: the new one carries on as the one
// Envoy; Envoy's child aborts when it next asks its dead parent something
// (to drain, to terminate), and that exit ends the Serve call as any crash
// does: the next start is cold, epoch 0.
func (r *run) oldExitedFirst(ctx context.Context) {
	old, next := r.child, r.hot.next
	old.wait()
	code, reason := old.exitStatus()
	if code == 0 && r.nextIsReady(ctx) {
		r.nextReadiness(readiness{epoch: next.epoch, ready: true})
		r.parentExited()
		return
	}
	r.s.keepCrashRecord(old, r.s.bootstrap)
	r.s.log.Warn("the serving envoy exited during a hot restart; the new epoch carries on alone",
		"old_epoch", old.restartEpoch, "old_pid", old.pid, "exit_code", code, "status", reason,
		"new_epoch", next.restartEpoch, "pid", next.pid)
	r.child, r.hot.next, r.hot.nextDeadline = next, nil, nil
	r.adopt(r.hot.nextGen)
	r.state = messages.EnvoyState{Phase: messages.EnvoyRunning, Epoch: next.epoch, PID: next.pid, Started: next.started,
		RestartEpoch: next.restartEpoch, ExitCode: code, ExitReason: reason}
	r.publish()
	r.s.setHealth(messages.Starting, "the old envoy exited during a hot restart; the new one is starting")
}

// nextIsReady is the new epoch's readiness now: a verdict the poll sent
// and the loop has not read yet, else one question to its admin API.
func (r *run) nextIsReady(ctx context.Context) bool {
	next := r.hot.next
	select {
	case v := <-r.poll.out:
		if v.epoch == next.epoch && v.ready {
			return true
		}
	default:
	}
	ready, _ := r.s.admin.readiness(ctx, next.restartEpoch)
	return ready
}

// parentExited ends the overlap.
func (r *run) parentExited() {
	p := r.hot.parent
	p.wait()
	code, reason := p.exitStatus()
	r.hot.parent, r.hot.parentDeadline = nil, nil
	// Logged before the state goes out: whoever sees the overlap over
	// finds its line (TestHotRestartRefusesNoConnection failed in CI when
	// it read the log between the two).
	log := r.s.log.With("old_epoch", p.restartEpoch, "old_pid", p.pid, "status", reason, "epoch", r.child.restartEpoch)
	if code == 0 {
		log.Info("hot restart done: the old epoch exited", "outcome", "done")
	} else {
		log.Warn("hot restart done: the old epoch exited with an error", "outcome", "done", "exit_code", code)
	}
	r.state.Overlap = messages.EnvoyProcess{}
	r.publish()
	if r.state.Phase == messages.EnvoyReady {
		r.s.setHealth(messages.Ready, r.overlapNote())
	}
}

// parentOverdue stops an old epoch the new one did not end in time.
func (r *run) parentOverdue() {
	r.hot.parentDeadline = nil
	p := r.hot.parent
	r.s.log.Warn("the old epoch outlived the parent shutdown time; stopping it", "old_epoch", p.restartEpoch, "old_pid", p.pid)
	p.terminate(r.s.cfg.KillGrace, r.s.clock, r.s.log)
	r.parentExited()
}

// abandonHotRestart gives up a hot restart not yet taken over (a drain or
// a stop came): a validation under way, or the new epoch starting.
func (r *run) abandonHotRestart(why string) {
	r.hot.cancelValidation()
	r.hot.pending = ""
	if next := r.hot.next; next != nil {
		r.s.log.Info("stopping the new epoch of a hot restart", "new_epoch", next.restartEpoch, "pid", next.pid, "reason", why)
		r.poll.stop() // it asked the new epoch
		// Killed: its shutdown (SIGTERM) would end the serving epoch too,
		// which a drain that keeps Envoy running (POST /drain) must not.
		next.kill(r.s.log)
		r.hot.next, r.hot.nextGen, r.hot.nextDeadline = nil, nil, nil
		r.s.restore(r.s.gen)
		r.state.Overlap = messages.EnvoyProcess{}
		r.s.hotBlocked = fmt.Sprintf("epoch %d (pid %d) was stopped before it took over (%s), leaving Envoy's shared memory marked initializing", next.restartEpoch, next.pid, why)
	}
}

// stopOthers stops every Envoy but the serving one: the new epoch not yet
// taken over, the old one draining.
func (r *run) stopOthers(why string) {
	r.abandonHotRestart(why)
	if p := r.hot.parent; p != nil {
		r.s.log.Info("stopping the old epoch", "old_epoch", p.restartEpoch, "pid", p.pid, "reason", why)
		p.terminate(r.s.cfg.KillGrace, r.s.clock, r.s.log)
		r.hot.parent, r.hot.parentDeadline = nil, nil
		r.state.Overlap = messages.EnvoyProcess{}
	}
}

// children are the Envoys of the run.
func (r *run) children() []*child {
	cs := []*child{r.child}
	for _, c := range []*child{r.hot.next, r.hot.parent} {
		if c != nil {
			cs = append(cs, c)
		}
	}
	return cs
}

// overlapNote is the health reason during an overlap, which /debug/tree
// shows on the envoy line; otherwise whether Envoy answers the kubelet's
// probe itself (agentready.go), why the last hot restart was refused and
// whether memory goes unchecked, or "".
func (r *run) overlapNote() string {
	switch {
	case r.hot.next != nil:
		return fmt.Sprintf("hot restart: epoch %d (pid %d) serving, epoch %d (pid %d) starting",
			r.child.restartEpoch, r.child.pid, r.hot.next.restartEpoch, r.hot.next.pid)
	case r.hot.parent != nil:
		return fmt.Sprintf("hot restart: epoch %d (pid %d) serving, epoch %d (pid %d) draining",
			r.child.restartEpoch, r.child.pid, r.hot.parent.restartEpoch, r.hot.parent.pid)
	}
	var notes []string
	if r.envoyAnswers {
		notes = append(notes, "envoy answers the kubelet's readiness probe itself ("+bootstrap.ReadinessKey+"=100)")
	}
	for _, n := range []string{r.hot.refused, r.s.memoryUnknown} {
		if n != "" {
			notes = append(notes, n)
		}
	}
	return strings.Join(notes, "; ")
}
