package main

import (
	"log/slog"
	"runtime/debug"
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

// setSidecarGC applies the plan's GC target; nil when the operator chose
// GOGC (set, even empty, as read by config.Build), which Go's runtime
// applied itself.
func setSidecarGC(percent *int, log *slog.Logger) {
	if percent == nil {
		log.Debug("GC target from GOGC")
		return
	}
	debug.SetGCPercent(*percent)
}

// releaseStartupMemory runs once, when the agent first becomes ready: a
// full GC and returning the free pages of start-up's garbage (configuration
// parsing, Envoy's bootstrap) now, rather than when the scavenger gets to
// them. It gives back little (#36, measured: anon at the first ready 7.9
// and 8.1 MiB against 8.2 and 8.1 without it, the same by 3 s): start-up's
// heap peaks at 5 MB, below the idle GC cycle's goal, which sets the idle
// figure (docs/performance.md). It costs one GC.
//
// It no longer unmaps the start-up code pages of the executable (#24). That
// lowered the process's RSS (0.62× Istio's agent's) but not what Kubernetes
// counts and limits, the container's working set: the unmapped pages stay in
// the page cache, charged to the container, and the next run of the binary
// in the container (`kubectl exec ... pilot-agent`, the preStop drain) moved
// about 21 MiB of them to the active list. make bench-vs-istio, one run:
// working set after one such exec 38.8 MiB against Istio's 19.3 (2.0×) with
// the unmapping, 19.2 (0.99×) without; idle 18.1 both ways.
func releaseStartupMemory(log *slog.Logger) {
	debug.FreeOSMemory()
	log.Debug("released start-up memory")
}
