package main

import (
	"log/slog"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
)

// The agent's parallelism (#36): one P while it is idle
// (MESHAGENT_IDLE_GOMAXPROCS), under load the parallelism Go's runtime set
// at start: GOMAXPROCS, which Istio's injector sets from the container's
// CPU limit, or the CPU limit itself.
//
// At idle the agent's work is small bursts: a scrape every 15 s, gRPC's
// keepalives, a GC every 2 minutes. With two Ps every burst also woke a
// second thread, the scheduler's spinning M looking for work to steal,
// which found none: context switches were ~15 % of a scrape's CPU (perf).
// On one P (rig, the shipped binary beside Istio's agent, three 150 s
// windows): 0.92, 0.83 and 0.94 CPU s an hour against 1.05, 0.94 and 1.03
// on two, and 1.0 MiB less anon (9.4–9.5 against 10.4–10.8: the second P's
// caches and threads). Under load one P caps the agent at one core. The
// xDS and DNS rows of make bench-vs-istio did not move beyond their spread
// with GOMAXPROCS=1 for the whole run (on these 2 cores dnsperf and the
// kernel bound the DNS rows first), but an agent busy beyond one core would
// be held back, so it goes back to Go's own parallelism once it is busy.
//
// Busy is read at each GC, the one moment that comes often under load and
// seldom at idle: the share of a core the process used since the previous
// GC. Reading it costs nothing between GCs, where a timer would wake the
// idle agent to find it idle. A load that allocates is seen within a GC or
// two (under DNS saturation a GC comes every few tens of ms); a load that
// ends is seen at the next GC, at the latest the runtime's 2-minute one.
const (
	// busyShare: above this share of a core between two GCs the agent
	// takes Go's parallelism back.
	busyShare = 0.2
	// idleShare: below it, one P again. Far below busyShare, so that a
	// steady load does not flip it at every GC.
	idleShare = 0.05
)

// parallelism follows the agent's load at each GC. Its state is owned by
// the runtime's cleanup goroutine, which runs afterGC one at a time.
type parallelism struct {
	log        *slog.Logger
	set        func(int) int        // runtime.GOMAXPROCS; a test's records
	cpu        func() time.Duration // processCPU; a test's is made up
	now        func() time.Time     // time.Now; a test's is made up
	idle, busy int                  // GOMAXPROCS at idle (1) and under load (Go's own)
	current    int
	lastCPU    time.Duration
	lastWall   time.Time
	stopped    atomic.Bool // a test's: no more GCs followed
}

// followLoad sets GOMAXPROCS to idle now and follows the load from then
// on: busy is Go's own parallelism, as the runtime set it at start. An idle
// parallelism not below it changes nothing (nil): the agent never takes
// more Ps than the CPU limit or GOMAXPROCS gave it.
func followLoad(idle int, log *slog.Logger) *parallelism {
	busy := runtime.GOMAXPROCS(0)
	if idle >= busy {
		return nil
	}
	p := &parallelism{log: log, set: runtime.GOMAXPROCS, cpu: processCPU, now: time.Now, idle: idle, busy: busy, current: idle}
	p.lastCPU, p.lastWall = p.cpu(), p.now()
	p.set(idle)
	p.arm()
	return p
}

// arm runs afterGC after the next GC; afterGC arms it again.
func (p *parallelism) arm() {
	if p.stopped.Load() {
		return
	}
	afterNextGC(p.afterGC)
}

// afterNextGC runs f on the runtime's cleanup goroutine once the next GC
// has found a fresh sentinel unreachable: the one hook Go gives into its
// GC cycles (the start-up hold and the load follower use it).
func afterNextGC(f func()) {
	sentinel := new([32]byte) // not a tiny object: those share a block, and their cleanups may not run
	runtime.AddCleanup(sentinel, func(f func()) { f() }, f)
}

func (p *parallelism) afterGC() {
	defer p.arm()
	cpu, now := p.cpu(), p.now()
	share := float64(cpu-p.lastCPU) / float64(now.Sub(p.lastWall))
	p.lastCPU, p.lastWall = cpu, now
	if next := nextParallelism(p.current, p.idle, p.busy, share); next != p.current {
		p.set(next)
		p.log.Debug("GOMAXPROCS follows the load", "gomaxprocs", next, "cpu_share_since_last_gc", share)
		p.current = next
	}
}

// nextParallelism is the GOMAXPROCS after a GC that found the process using
// share of a core since the one before.
func nextParallelism(current, idle, busy int, share float64) int {
	switch {
	case current == idle && share > busyShare:
		return busy
	case current == busy && share < idleShare:
		return idle
	}
	return current
}

// processCPU is the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
