package envoy

// The epochs of a hot restart (#25; hotrestart.go says why and what). One
// run holds at most two Envoys: the one that serves (run.child) and, during
// an overlap, either the new epoch starting beside it (hotRun.next) or,
// once that one has taken over, the old epoch draining (hotRun.parent).
// Every event of either is a case of the run loop, so that each has one
// answer:
//
//	change → validate → next starts ─ready→ takes over: parent drains ─exits→ one Envoy
//	                        └─exits─→ failed epoch: the old one keeps serving
//
// A change seen during an overlap waits for its end, and is then looked at
// afresh (the files as they are then: the last change wins).

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/cgroupmem"
	"github.com/meshagent/meshagent/services/internal/filewatch"
)

// hotRun is the hot-restart part of a run. Its channels are nil, so that
// the run loop never selects them, when there is nothing to wait for.
type hotRun struct {
	watch *filewatch.Watcher
	dirs  []string // the watched directories
	// stamp is the inputs' identity (inputStamp) when last looked at.
	stamp string
	// next is the new epoch until it takes over (nextGen: what it was
	// started from, reason: the change that started it); nextDeadline
	// fires if it is not ready within HotRestart.TakeOverTimeout.
	next         *child
	nextGen      *generation
	reason       string
	nextDeadline <-chan time.Time
	// parent is the old epoch, draining, once the new one took over;
	// parentDeadline fires if it outlives the parent shutdown time.
	parent         *child
	parentDeadline <-chan time.Time
	// validated brings the result of envoy --mode validate under way;
	// stopValidate cancels it.
	validated    chan validation
	stopValidate context.CancelFunc
	// pending is the change that came during an overlap, "" if none.
	pending string
	// refused says why the last hot restart did not happen ("" after one
	// that did): /debug/tree shows it on the envoy line (#33: a binary
	// that could not be read left it saying "ready" and nothing else).
	refused string
}

// validation is the result of validating a new generation.
type validation struct {
	gen    *generation
	reason string
	err    error
}

func (h *hotRun) nextDone() <-chan struct{} {
	if h.next == nil {
		return nil
	}
	return h.next.done
}

func (h *hotRun) parentDone() <-chan struct{} {
	if h.parent == nil {
		return nil
	}
	return h.parent.done
}

func (h *hotRun) changes() <-chan []string {
	if h.watch == nil {
		return nil
	}
	return h.watch.Changes()
}

func (h *hotRun) watchFailed() <-chan error {
	if h.watch == nil {
		return nil
	}
	return h.watch.Failed()
}

// busy says whether a hot restart is under way: a change must wait.
func (h *hotRun) busy() bool { return h.next != nil || h.parent != nil || h.validated != nil }

// close stops the watch and a validation under way, and waits for them.
func (h *hotRun) close() {
	if h.watch != nil {
		h.watch.Close()
		h.watch = nil
	}
	h.cancelValidation()
}

func (h *hotRun) cancelValidation() {
	if h.validated != nil {
		h.stopValidate()
		<-h.validated
		h.validated, h.stopValidate = nil, nil
	}
}

// watchDirs are the directories of files, sorted, without repeats.
func watchDirs(files []string) []string {
	var dirs []string
	for _, f := range files {
		if f != "" {
			dirs = append(dirs, filepath.Dir(f))
		}
	}
	slices.Sort(dirs)
	return slices.Compact(dirs)
}

// watchInputs starts watching what Envoy is started from, with hot restart
// on.
func (r *run) watchInputs() error {
	hr := r.s.cfg.HotRestart
	if hr == nil {
		return nil
	}
	r.hot.dirs = watchDirs(r.inputFiles())
	w, err := filewatch.Start(filewatch.Options{Clock: r.s.clock, Log: r.s.log, Debounce: hr.Debounce}, r.hot.dirs...)
	if err != nil {
		return fmt.Errorf("hot restart: %w", err)
	}
	r.hot.watch = w
	r.hot.stamp = r.inputStamp()
	_, err = cgroupmem.Self(hr.CgroupRoot)
	r.memoryUnknown(err) // said from the start, not at the first change
	r.s.log.Info("hot restart on: watching envoy's inputs", "dirs", r.hot.dirs, "base_id", hr.BaseID)
	return nil
}

// rewatch follows the inputs of the generation that now serves (a new
// mesh config may name another template).
func (r *run) rewatch() {
	hr := r.s.cfg.HotRestart
	if r.hot.watch == nil || hr == nil {
		return
	}
	dirs := watchDirs(r.inputFiles())
	if slices.Equal(dirs, r.hot.dirs) {
		return
	}
	r.hot.watch.Add(dirs...)
	r.hot.watch.Remove(r.hot.dirs...)
	r.hot.dirs = dirs
	r.hot.stamp = r.inputStamp()
}

// inputFiles are what Envoy is started from, as hot restart watches them:
// the configured inputs and Envoy's binary.
func (r *run) inputFiles() []string {
	return append(slices.Clone(r.s.cfg.HotRestart.Watch), r.s.cfg.BinaryPath)
}

// inputStamp identifies the inputs' files as they are now (statFile; "-"
// for one missing): a directory event that leaves every input as it was
// (the agent's own write of the bootstrap in a watched directory, another
// program's file beside Envoy's binary) is no change, and renders nothing.
func (r *run) inputStamp() string {
	var b strings.Builder
	for _, f := range r.inputFiles() {
		if f == "" {
			continue
		}
		if id, err := statFile(f); err == nil {
			fmt.Fprintf(&b, "%s %v\n", f, id)
		} else {
			fmt.Fprintf(&b, "%s -\n", f)
		}
	}
	return b.String()
}

// changedInputs names the inputs whose stamp line differs.
func changedInputs(before, after string) []string {
	old := map[string]bool{}
	for l := range strings.SplitSeq(before, "\n") {
		old[l] = true
	}
	var names []string
	for l := range strings.SplitSeq(after, "\n") {
		if l != "" && !old[l] {
			name, _, _ := strings.Cut(l, " ")
			names = append(names, name)
		}
	}
	return names
}

// inputsChanged looks at a change of the watched directories.
func (r *run) inputsChanged(ctx context.Context, dirs []string) {
	stamp := r.inputStamp()
	files := changedInputs(r.hot.stamp, stamp)
	if len(files) == 0 {
		r.s.log.Debug("a watched directory changed, none of envoy's inputs", "dirs", dirs)
		return
	}
	r.hot.stamp = stamp
	reason := "changed: " + strings.Join(files, ", ")
	switch {
	case r.drain != notDrained:
		r.s.log.Info("envoy's inputs changed while draining; no hot restart", "reason", reason)
	case r.hot.busy() || r.state.Phase != messages.EnvoyReady:
		// At most two epochs: the change waits for the overlap's end (or
		// for the one Envoy to be ready), and is then read afresh.
		r.s.log.Info("envoy's inputs changed during a hot restart or a start; looked at once it is over", "reason", reason)
		if r.hot.pending != "" {
			reason = r.hot.pending + "; " + reason
		}
		r.hot.pending = reason
	default:
		r.consider(ctx, reason)
	}
}

// afterOverlap looks at a change that waited.
func (r *run) afterOverlap(ctx context.Context) {
	if reason := r.hot.pending; reason != "" && !r.hot.busy() && r.drain == notDrained && r.state.Phase == messages.EnvoyReady {
		r.hot.pending = ""
		r.consider(ctx, reason)
	}
}

// consider renders Envoy's inputs again and, if what Envoy would be started
// from differs, validates it (validated goes on).
func (r *run) consider(ctx context.Context, reason string) {
	s := r.s
	log := s.log.With("old_epoch", r.child.restartEpoch, "reason", reason)
	if s.hotBlocked != "" {
		log.Error("hot restart refused; the running envoy keeps serving, and the change waits for its next start", "outcome", "refused", "why", s.hotBlocked)
		r.refuse(errors.New(s.hotBlocked))
		return
	}
	cfg, err := s.cfg.HotRestart.Reload()
	if err == nil {
		hr := *s.cfg.HotRestart
		if cfg.HotRestart != nil {
			hr.Watch = cfg.HotRestart.Watch
		}
		cfg.HotRestart = &hr
		err = cfg.Validate()
		cfg = cfg.withDefaults()
	}
	if err == nil && cfg.AdminAddr != s.cfg.AdminAddr {
		// The readiness poll and the drains follow the admin port given
		// at start: a new epoch elsewhere would never be seen ready.
		err = fmt.Errorf("envoy's admin address changed (%s to %s): it applies at envoy's next start", s.cfg.AdminAddr, cfg.AdminAddr)
	}
	if err != nil {
		log.Error("hot restart: envoy's inputs do not make a configuration; envoy left alone", "error", err)
		r.refuse(err)
		return
	}
	g, err := render(cfg)
	if err != nil {
		s.restore(s.gen)
		log.Error("hot restart: envoy's bootstrap or binary cannot be prepared; envoy left alone", "error", err)
		r.refuse(err)
		return
	}
	what, err := s.gen.changes(g, r.child.pid)
	if err == nil && len(what) == 0 {
		log.Info("envoy's inputs changed but not its bootstrap, command line or binary; no hot restart")
		r.refuse(nil)
		return
	}
	if err == nil {
		// Before envoy --mode validate, which loads the whole bootstrap
		// as a second Envoy would: with little headroom the validation
		// itself was the OOM kill (#33).
		err = r.roomForTwo()
	}
	if err != nil {
		s.restore(s.gen)
		log.Error("hot restart refused; the running envoy keeps serving", "outcome", "refused", "error", err)
		r.refuse(err)
		return
	}
	log.Info("hot restart: validating the new bootstrap", "what", strings.Join(what, ", "), "binary", g.binary)
	vctx, cancel := context.WithCancel(ctx)
	ch := make(chan validation, 1)
	r.hot.validated, r.hot.stopValidate = ch, cancel
	go func() { ch <- validation{gen: g, reason: reason, err: validateBootstrap(vctx, g)} }()
}

// refuse records why a hot restart did not happen (nil: there was nothing
// to restart for) and shows it on the envoy line of /debug/tree.
func (r *run) refuse(err error) {
	r.hot.refused = ""
	if err != nil {
		r.hot.refused = "hot restart refused: " + err.Error()
	}
	if r.state.Phase == messages.EnvoyReady && !r.hot.busy() {
		r.s.setHealth(messages.Ready, r.overlapNote())
	}
}

// roomForTwo is the memory check of a second epoch. A memory cgroup the
// agent cannot find is no check at all: it is logged once and shown on the
// envoy line of /debug/tree (#33; it was skipped without a word).
func (r *run) roomForTwo() error {
	err := roomForTwo(r.s.cfg.HotRestart.CgroupRoot, r.child.pid)
	if r.memoryUnknown(err) {
		return nil
	}
	return err
}

// memoryUnknown says whether err is cgroupmem.ErrUnknown, and notes it the
// first time.
func (r *run) memoryUnknown(err error) bool {
	if !errors.Is(err, cgroupmem.ErrUnknown) {
		return false
	}
	if r.s.memoryUnknown == "" {
		r.s.memoryUnknown = "no memory check before a hot restart: " + err.Error()
		r.s.log.Warn("hot restart: the memory cgroup cannot be read; a second epoch starts without a memory check", "error", err)
	}
	return true
}

// validated goes on with a validated generation: the memory check, then
// the new epoch beside the old one.
func (r *run) validated(ctx context.Context, v validation) {
	r.hot.validated, r.hot.stopValidate = nil, nil
	s := r.s
	oldEpoch, newEpoch := r.child.restartEpoch, r.child.restartEpoch+1
	log := s.log.With("old_epoch", oldEpoch, "new_epoch", newEpoch, "reason", v.reason)
	err := v.err
	if err == nil && r.drain != notDrained {
		err = fmt.Errorf("a drain began")
	}
	if err == nil {
		// Again: the container's use may have grown during the validation.
		err = r.roomForTwo()
	}
	var next *child
	if err == nil {
		next, err = s.spawn(v.gen.cfg, v.gen.args, newEpoch)
	}
	if err != nil {
		s.restore(s.gen)
		log.Error("hot restart refused; the running envoy keeps serving", "outcome", "refused", "error", err)
		r.refuse(err)
		r.afterOverlap(ctx)
		return
	}
	r.hot.next, r.hot.nextGen, r.hot.reason = next, v.gen, v.reason
	r.hot.nextDeadline = s.clock.After(s.cfg.HotRestart.TakeOverTimeout)
	r.poll.stop()
	r.poll = s.startPoller(ctx, next)
	r.state.Overlap = processOf(next, messages.EnvoyRunning)
	r.publish()
	s.setHealth(messages.Ready, r.overlapNote())
	log.Info("hot restart: new epoch started beside the old one", "pid", next.pid, "old_pid", r.child.pid)
}

func processOf(c *child, phase messages.EnvoyPhase) messages.EnvoyProcess {
	return messages.EnvoyProcess{Phase: phase, Epoch: c.epoch, PID: c.pid, RestartEpoch: c.restartEpoch, Started: c.started}
}

// nextReadiness records the new epoch's readiness; ready, it takes over.
func (r *run) nextReadiness(v readiness) {
	next := r.hot.next
	if v.epoch != next.epoch || !v.ready {
		return
	}
	old := r.child
	r.child, r.hot.parent, r.hot.next, r.hot.nextDeadline = next, old, nil, nil
	r.hot.refused = ""
	r.adopt(r.hot.nextGen)
	hr := r.s.cfg.HotRestart
	r.hot.parentDeadline = r.s.clock.After(hr.ParentShutdownDuration + r.s.cfg.KillGrace)
	r.state.Phase, r.state.Epoch, r.state.PID, r.state.Started = messages.EnvoyReady, next.epoch, next.pid, next.started
	r.state.RestartEpoch, r.state.NotReady = next.restartEpoch, ""
	r.state.Overlap = processOf(old, messages.EnvoyDraining)
	r.publish()
	r.s.setHealth(messages.Ready, r.overlapNote())
	r.s.log.Info("hot restart: the new epoch took over; the old one drains and exits", "outcome", "taken over",
		"old_epoch", old.restartEpoch, "old_pid", old.pid, "new_epoch", next.restartEpoch, "pid", next.pid,
		"reason", r.hot.reason, "parent_shutdown", hr.ParentShutdownDuration)
}

// adopt makes g what Envoy is started from: a later cold start (after a
// crash) uses it.
func (r *run) adopt(g *generation) {
	s := r.s
	s.gen, s.cfg, r.hot.nextGen = g, g.cfg, nil
	if g.rendered != nil {
		s.bootstrap = g.rendered
	}
	r.rewatch()
}
