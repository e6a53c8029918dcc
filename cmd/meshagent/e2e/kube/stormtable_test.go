package kube

// The storm's tables (#36): one per round, and the rounds' p95 ratios.

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// geomean is the geometric mean of positive ratios.
func geomean(xs []float64) float64 {
	sum := 0.0
	for _, x := range xs {
		sum += math.Log(x)
	}
	return math.Exp(sum / float64(len(xs)))
}

// quantile is the q-quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// mostWithin is the most of sorted (times from one moment) that fall in
// any window of d.
func mostWithin(sorted []time.Duration, d time.Duration) int {
	most := 0
	for i := range sorted {
		j := i
		for j < len(sorted) && sorted[j]-sorted[i] < d {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// printStormTable prints one round's table: ours, Istio's agent's, and the
// ratio; round says which round, and the agents' order. floor, when not
// nil, is the storm of a sidecar that costs nothing (STORM_FLOOR=1): its
// start and delete rows follow the table.
func printStormTable(t *testing.T, pods int, round string, ours, istio, floor *stormResult) {
	type row struct {
		name   string
		o, i   float64
		format func(float64) string
	}
	dur := func(v float64) string { return fmt.Sprintf("%.1f s", v) }
	dur2 := func(v float64) string { return fmt.Sprintf("%.2f s", v) }
	count := func(v float64) string { return fmt.Sprintf("%.0f", v) }
	ds := func(d time.Duration) float64 { return d.Seconds() }
	spread := func(sorted []time.Duration) float64 { return ds(quantile(sorted, 1) - quantile(sorted, 0)) }
	rows := []row{
		{"created → Ready p50", ds(quantile(ours.ready, 0.5)), ds(quantile(istio.ready, 0.5)), dur},
		{"created → Ready p95", ds(quantile(ours.ready, 0.95)), ds(quantile(istio.ready, 0.95)), dur},
		{"created → Ready max", ds(ours.readyAll), ds(istio.readyAll), dur},
		{"created → capture done (istio-init), p50", ds(quantile(ours.toInitDone, 0.5)), ds(quantile(istio.toInitDone, 0.5)), dur2},
		{"created → capture done (istio-init), p95", ds(quantile(ours.toInitDone, 0.95)), ds(quantile(istio.toInitDone, 0.95)), dur2},
		{"created → sidecar container started, p50", ds(quantile(ours.toSidecar, 0.5)), ds(quantile(istio.toSidecar, 0.5)), dur2},
		{"created → sidecar container started, p95", ds(quantile(ours.toSidecar, 0.95)), ds(quantile(istio.toSidecar, 0.95)), dur2},
		{"CSRs at istiod's CA", ours.csrs, istio.csrs, count},
		{"  of which failed", ours.csrErrors, istio.csrErrors, count},
		{"  sidecar started → certificate, p50", ds(quantile(ours.certificate, 0.5)), ds(quantile(istio.certificate, 0.5)), dur2},
		{"  sidecar started → certificate, p95", ds(quantile(ours.certificate, 0.95)), ds(quantile(istio.certificate, 0.95)), dur2},
		{"  pods with a certificate line", float64(len(ours.certificate)), float64(len(istio.certificate)), count},
		{"sidecar started → agent ready, p50", ds(quantile(ours.agentReady, 0.5)), ds(quantile(istio.agentReady, 0.5)), dur2},
		{"sidecar started → agent ready, p95", ds(quantile(ours.agentReady, 0.95)), ds(quantile(istio.agentReady, 0.95)), dur2},
		{"agent ready → app container started, p50", ds(quantile(ours.readyToApp, 0.5)), ds(quantile(istio.readyToApp, 0.5)), dur2},
		{"agent ready → app container started, p95", ds(quantile(ours.readyToApp, 0.95)), ds(quantile(istio.readyToApp, 0.95)), dur2},
		{"app container started → pod Ready, p50", ds(quantile(ours.appToReady, 0.5)), ds(quantile(istio.appToReady, 0.5)), dur2},
		{"app container started → pod Ready, p95", ds(quantile(ours.appToReady, 0.95)), ds(quantile(istio.appToReady, 0.95)), dur2},
		{"sidecar started → app container started, p50", ds(quantile(ours.sidecarToApp, 0.5)), ds(quantile(istio.sidecarToApp, 0.5)), dur2},
		{"sidecar started → app container started, p95", ds(quantile(ours.sidecarToApp, 0.95)), ds(quantile(istio.sidecarToApp, 0.95)), dur2},
		{"istio-proxy working sets, sum (MiB)", ours.workingSet / (1 << 20), istio.workingSet / (1 << 20), func(v float64) string { return fmt.Sprintf("%.1f", v) }},
		{"istio-proxy CPU, sum (s)", ours.cpu, istio.cpu, func(v float64) string { return fmt.Sprintf("%.2f", v) }},
		{"delete → all gone", ds(ours.gone), ds(istio.gone), dur},
		{"delete → the node quiet again", ds(ours.quiet), ds(istio.quiet), dur},
		{"container restarts", float64(ours.restarts), float64(istio.restarts), count},
		{"timeouts in sidecar logs, start", float64(len(ours.timeouts)), float64(len(istio.timeouts)), count},
		{"istiod restarted → all synced", ds(ours.syncedAll), ds(istio.syncedAll), dur},
		{"  first synced", ds(quantile(ours.synced, 0)), ds(quantile(istio.synced, 0)), dur},
		{"  p50 synced", ds(quantile(ours.synced, 0.5)), ds(quantile(istio.synced, 0.5)), dur},
		{"  spread first → last", spread(ours.synced), spread(istio.synced), dur},
		{"  reconnects at istiod, first → last", spread(ours.reconnects), spread(istio.reconnects), dur},
		{"  most reconnects in one 100 ms", float64(mostWithin(ours.reconnects, 100*time.Millisecond)), float64(mostWithin(istio.reconnects, 100*time.Millisecond)), count},
		{"  new name resolved, restart → p50", ds(quantile(ours.nameCurrent, 0.5)), ds(quantile(istio.nameCurrent, 0.5)), dur},
		{"  new name resolved, restart → max", ds(quantile(ours.nameCurrent, 1)), ds(quantile(istio.nameCurrent, 1)), dur},
		{"  new name not resolved", float64(ours.namesMissing), float64(istio.namesMissing), count},
		{"requests on connections open before", float64(ours.outageOK + ours.outageFailed), float64(istio.outageOK + istio.outageFailed), count},
		{"  of which failed", float64(ours.outageFailed), float64(istio.outageFailed), count},
		{"  connections broken", float64(ours.brokenConns), float64(istio.brokenConns), count},
		{"pods synced again", float64(len(ours.synced)), float64(len(istio.synced)), count},
		{"pods leaving Ready meanwhile", float64(ours.unready), float64(istio.unready), count},
		{"timeouts in sidecar logs, after", float64(len(ours.reconnectLogs)), float64(len(istio.reconnectLogs)), count},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "storm table, %d pods, native sidecars, %s, %s\n", pods, round, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "| %-44s | %10s | %10s | %5s |\n", "", "meshagent", "Istio's", "ratio")
	fmt.Fprintf(&b, "|%s|%s|%s|%s|\n", strings.Repeat("-", 46), strings.Repeat("-", 12), strings.Repeat("-", 12), strings.Repeat("-", 7))
	line := func(r row) {
		ratio := "-"
		if r.i != 0 {
			ratio = fmt.Sprintf("%.2f", r.o/r.i)
		}
		fmt.Fprintf(&b, "| %-44s | %10s | %10s | %5s |\n", r.name, r.format(r.o), r.format(r.i), ratio)
	}
	for _, r := range rows {
		line(r)
	}
	if floor != nil {
		fmt.Fprintf(&b, "the floor, a sidecar that costs nothing (floorproxy), / Istio's:\n")
		for _, r := range []row{
			{"created → Ready p50", ds(quantile(floor.ready, 0.5)), ds(quantile(istio.ready, 0.5)), dur},
			{"created → Ready p95", ds(quantile(floor.ready, 0.95)), ds(quantile(istio.ready, 0.95)), dur},
			{"created → Ready max", ds(floor.readyAll), ds(istio.readyAll), dur},
			{"delete → all gone", ds(floor.gone), ds(istio.gone), dur},
			{"delete → the node quiet again", ds(floor.quiet), ds(istio.quiet), dur},
			{"container restarts", float64(floor.restarts), float64(istio.restarts), count},
		} {
			line(r)
		}
	}
	for _, x := range []struct {
		who string
		r   *stormResult
	}{{"meshagent", ours}, {"istio", istio}} {
		for _, l := range append(x.r.timeouts[:min(3, len(x.r.timeouts))], x.r.reconnectLogs[:min(3, len(x.r.reconnectLogs))]...) {
			fmt.Fprintf(&b, "  %s timeout line: %.200s\n", x.who, l)
		}
		for _, l := range x.r.outageFailures {
			fmt.Fprintf(&b, "  %s request failed while istiod was away: %.200s\n", x.who, l)
		}
	}
	t.Log("\n" + b.String())
}
