package main

import (
	"bytes"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// restoreGC puts the test process's GC target and memory limit back.
func restoreGC(t *testing.T) {
	t.Helper()
	percent := debug.SetGCPercent(100)
	limit := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })
}

func TestStartupHoldUntilReady(t *testing.T) {
	restoreGC(t)
	debug.SetMemoryLimit(512 << 20) // as memlimit.Apply would from a 569 MiB container
	var logs bytes.Buffer
	g := &startupHold{log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	percent := 50
	g.hold(&percent, 0)
	if got := debug.SetGCPercent(-1); got != -1 {
		t.Fatalf("GC target while starting = %d, want off (-1)", got)
	}
	if got := debug.SetMemoryLimit(-1); got != startupHeapCeiling {
		t.Fatalf("memory limit while starting = %d, want the start-up ceiling %d", got, startupHeapCeiling)
	}
	g.release("ready")
	g.release("ready") // the tree's first ready is once, but a late timer must not set it twice
	if got := debug.SetGCPercent(-1); got != 50 {
		t.Fatalf("GC target once ready = %d, want 50", got)
	}
	debug.SetGCPercent(50)
	if got := debug.SetMemoryLimit(-1); got != 512<<20 {
		t.Fatalf("memory limit once ready = %d, want the container's %d back", got, 512<<20)
	}
	if n := strings.Count(logs.String(), "start-up memory released"); n != 1 {
		t.Fatalf("released %d times, want once:\n%s", n, logs.String())
	}
}

func TestStartupHoldKeepsALowerContainerLimit(t *testing.T) {
	restoreGC(t)
	debug.SetMemoryLimit(16 << 20)
	g := &startupHold{log: slog.New(slog.DiscardHandler)}
	percent := 50
	g.hold(&percent, 0)
	defer g.release("test")
	if got := debug.SetMemoryLimit(-1); got != 16<<20 {
		t.Fatalf("memory limit while starting = %d, want the container's lower %d", got, 16<<20)
	}
}

func TestStartupHoldEndsForAnAgentNeverReady(t *testing.T) {
	restoreGC(t)
	logs := testkit.NewLogBuffer(t)
	g := &startupHold{log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), holdMax: 10 * time.Millisecond}
	percent := 50
	g.hold(&percent, 0)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "not ready after 10ms") {
		if time.Now().After(deadline) {
			t.Fatalf("the hold did not end by itself:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := debug.SetGCPercent(50); got != 50 {
		t.Fatalf("GC target after the hold's end = %d, want 50", got)
	}
}

func TestStartupHoldLeavesAnOperatorsGOGC(t *testing.T) {
	restoreGC(t)
	debug.SetGCPercent(80) // as Go's runtime set it from GOGC=80
	g := &startupHold{log: slog.New(slog.DiscardHandler)}
	g.hold(nil, 0)
	if got := debug.SetGCPercent(-1); got != 80 {
		t.Fatalf("GC target with GOGC set = %d, want the operator's 80", got)
	}
	debug.SetGCPercent(80)
	g.release("ready")
	if got := debug.SetGCPercent(-1); got != 80 {
		t.Fatalf("GC target after release with GOGC set = %d, want the operator's 80", got)
	}
}

func TestStartupHoldSetsGOMAXPROCSOnceReady(t *testing.T) {
	restoreGC(t)
	before := runtime.GOMAXPROCS(2) // as Go's runtime set it from a 2-CPU limit
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	g := &startupHold{log: slog.New(slog.DiscardHandler)}
	percent, procs := 50, 1
	g.hold(&percent, procs)
	if got := runtime.GOMAXPROCS(0); got != 2 {
		t.Fatalf("GOMAXPROCS while starting = %d, want Go's own 2: the start runs the key beside the rest", got)
	}
	g.release("ready")
	if g.parallel == nil {
		t.Fatal("once ready, nothing follows the load")
	}
	g.parallel.stopped.Store(true)
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("GOMAXPROCS once ready = %d, want 1", got)
	}
	if g.parallel.idle != 1 || g.parallel.busy != 2 {
		t.Fatalf("follows the load between %d and %d Ps, want 1 and Go's own 2", g.parallel.idle, g.parallel.busy)
	}
}

// An idle parallelism of 0 (off), or not below the one Go's runtime set
// at start, leaves GOMAXPROCS as it is, and nothing follows the load.
func TestStartupHoldLeavesParallelism(t *testing.T) {
	for _, tc := range []struct {
		name string
		idle int // MESHAGENT_IDLE_GOMAXPROCS
	}{
		{"off", 0},
		{"above the limit's", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			restoreGC(t)
			before := runtime.GOMAXPROCS(2) // the CPU limit's, or GOMAXPROCS=2
			t.Cleanup(func() { runtime.GOMAXPROCS(before) })
			g := &startupHold{log: slog.New(slog.DiscardHandler)}
			percent := 50
			g.hold(&percent, tc.idle)
			g.release("ready")
			if got := runtime.GOMAXPROCS(0); got != 2 || g.parallel != nil {
				t.Fatalf("GOMAXPROCS with MESHAGENT_IDLE_GOMAXPROCS=%d = %d (following the load: %v), want 2 always", tc.idle, got, g.parallel != nil)
			}
		})
	}
}

func TestStartupHoldEndsAtTheFirstGC(t *testing.T) {
	restoreGC(t)
	logs := testkit.NewLogBuffer(t)
	g := &startupHold{log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	percent := 50
	g.hold(&percent, 0)
	runtime.GC() // as the start-up ceiling would force one
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "start-up GC hold ended before ready") {
		if time.Now().After(deadline) {
			t.Fatalf("a GC during the hold did not end it:\n%s", logs.String())
		}
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	if got := debug.SetGCPercent(50); got != 50 {
		t.Fatalf("GC target after a GC at the ceiling = %d, want 50", got)
	}
	g.release("ready") // the first ready still returns the pages, once
	if n := strings.Count(logs.String(), "start-up memory released"); n != 1 {
		t.Fatalf("released %d times, want once:\n%s", n, logs.String())
	}
}
