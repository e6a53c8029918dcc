package main

import (
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync"
	"time"
)

// The agent's memory as a sidecar: what it holds is what every pod on the
// node pays for, so it gives back what only start-up needed (see
// bench/agent/rss.sh and docs/performance.md for the figures).

// The GC target the agent runs with unless GOGC is set is GOGC's default
// in the configuration's table: 50. The agent's live heap is small (a few MiB: proto registries, Envoy's
// bootstrap types, the DNS name table), so Go's default of 100 lets the heap
// double under DNS load for garbage that one cycle would free; 50 keeps
// 3.5 MiB less resident under load at no measurable CPU cost (a GC cycle
// over a few MiB is cheap; 30k QPS through the DNS proxy: 24.3 µs of agent
// CPU per query at 50 against 25.2 at 100, within the noise). Istio's agent
// sets no GC target.
//
// Until the agent is first ready, that target is held off (#36): start-up
// makes a few MB of garbage (the configuration, the bootstrap, the first
// xDS responses, the key) over a live heap of ~3 MB, and at 50 the GC ran
// several cycles through it, each a mark of the whole live heap, ~6 ms of
// a start's ~37 ms of agent CPU on an idle core. In a start storm the
// sidecar's CPU is what decides how soon every pod on the node is ready
// (docs/performance.md). The hold is bounded twice: a soft memory limit of
// startupHeapCeiling (or the container's, if lower) makes the GC run if
// start-up ever allocates that much, and that first GC ends the hold (a
// large mesh's first push can hold more than the ceiling live, and a GC
// run at a limit below the live heap would run again and again); and
// startupHoldMax ends it for an agent that does not become ready (its
// control plane down, say).
const (
	startupHeapCeiling = 32 << 20
	startupHoldMax     = 20 * time.Second
)

// startupHold is the agent's GC target, held off during start-up, and its
// parallelism: hold (runAgent, before the tree runs) turns the GC off,
// release (the tree's first ready, or startupHoldMax) sets the target and
// GOMAXPROCS. Both run once.
type startupHold struct {
	log     *slog.Logger
	held    bool
	percent int
	limit   int64 // the memory limit to go back to
	ended   sync.Once
	procs   int // GOMAXPROCS while idle once ready; 0: Go's own always
	// parallel follows the load once ready (followLoad); nil before, or
	// when procs is 0.
	parallel *parallelism
	once     sync.Once
	// holdMax is startupHoldMax; a test's may be shorter.
	holdMax time.Duration
}

// hold turns the GC off until release, under a soft memory limit, and
// keeps procs, the idle parallelism, for release. It holds nothing when
// the operator chose GOGC (percent nil: set, even empty, as read by
// config.Build), which Go's runtime applied itself. It runs after
// memlimit.Apply, whose limit it goes back to.
func (g *startupHold) hold(percent *int, procs int) {
	g.procs = procs
	if percent == nil {
		g.log.Debug("GC target from GOGC")
		return
	}
	g.held, g.percent = true, *percent
	g.limit = debug.SetMemoryLimit(-1) // -1 reads it
	debug.SetMemoryLimit(min(g.limit, startupHeapCeiling))
	debug.SetGCPercent(-1)
	if g.holdMax == 0 {
		g.holdMax = startupHoldMax
	}
	// Left to fire after a release: once makes them no-ops.
	time.AfterFunc(g.holdMax, func() { g.release("not ready after " + g.holdMax.String()) })
	afterNextGC(func() { g.endHold("a GC at the start-up ceiling") })
}

// endHold sets the GC target and the memory limit back, once: at the first
// ready (release), or at the first GC the ceiling forced.
func (g *startupHold) endHold(why string) {
	g.ended.Do(func() {
		debug.SetGCPercent(g.percent)
		debug.SetMemoryLimit(g.limit)
		if why != "ready" {
			g.log.Debug("start-up GC hold ended before ready", "gogc", g.percent, "why", why)
		}
	})
}

// release sets the agent's GC target and gives back what start-up held: a
// full GC, and the free pages returned now rather than when the scavenger
// gets to them.
//
// It no longer unmaps the start-up code pages of the executable (#24). That
// lowered the process's RSS (0.62× Istio's agent's) but not what Kubernetes
// counts and limits, the container's working set: the unmapped pages stay in
// the page cache, charged to the container, and the next run of the binary
// in the container (`kubectl exec ... pilot-agent`, the preStop drain) moved
// about 21 MiB of them to the active list.
func (g *startupHold) release(why string) {
	g.once.Do(func() {
		if g.held {
			g.endHold(why)
		}
		debug.FreeOSMemory()
		// After the GC above, whose interval was the start's, busy.
		if g.procs > 0 {
			g.parallel = followLoad(g.procs, g.log)
		}
		g.log.Debug("start-up memory released", "gogc", g.percent, "held", g.held, "gomaxprocs", runtime.GOMAXPROCS(0), "why", why)
	})
}
