package capture

import (
	"context"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// enterNetnsB moves the benchmark goroutine's thread into a fresh network
// namespace; processes it starts inherit it. The thread is never unlocked,
// so the runtime discards it (and the namespace) when the benchmark returns.
func enterNetnsB(b *testing.B) {
	b.Helper()
	testkit.RequireRoot(b, "network namespace, iptables", "iptables-restore")
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		b.Fatalf("unshare: %v", err)
	}
}

// BenchmarkApplySidecarRules times applying the injector's default sidecar
// rules (-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x "" -b '*' -d
// 15090,15021,15020) with one iptables-restore (ns/op) against a baseline
// of one iptables process per chain and rule, measured in the same run.
func BenchmarkApplySidecarRules(b *testing.B) {
	enterNetnsB(b)
	cfg := sidecarBenchRules(b)
	rs := Build(cfg)
	a, err := NewApplier("", false, testkit.TestLogger(b))
	if err != nil {
		b.Fatal(err)
	}
	var restoreExecs, baselineExecs int64
	cleanup := func() error { return a.Cleanup(rs) }
	baseline := timeAgainst(b, func() error {
		before := a.Execs()
		err := a.Apply(rs, false)
		restoreExecs += a.Execs() - before
		return err
	}, cleanup, func() error {
		baselineExecs += applyRuleByRule(b, a.v4.binary, rs.V4)
		return nil
	}, cleanup)
	restoreNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	baselineNs := float64(baseline.Nanoseconds()) / float64(b.N)
	b.ReportMetric(baselineNs, "rule-by-rule-ns/op")
	b.ReportMetric(baselineNs/restoreNs, "speedup-x")
	b.ReportMetric(float64(restoreExecs)/float64(b.N), "restore-procs/op")
	b.ReportMetric(float64(baselineExecs)/float64(b.N), "rule-by-rule-procs/op")
	b.ReportMetric(float64(len(rs.V4)), "rules")
}

// timeAgainst runs b.N rounds of apply, timed by b, and of baseline, timed
// here with b's timer stopped, undoing each before the next; it returns
// baseline's total, and leaves b's timer stopped for the caller's metrics.
func timeAgainst(b *testing.B, apply, undo, baseline, undoBaseline func() error) time.Duration {
	var total time.Duration
	b.ResetTimer()
	for range b.N {
		if err := apply(); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := undo(); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := baseline(); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		if err := undoBaseline(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	return total
}

// sidecarBenchRules is the typical sidecar both benchmarks apply: REDIRECT,
// all outbound, all inbound but the agent's ports.
func sidecarBenchRules(b testing.TB) RulesConfig {
	cfg := testRules(b)
	cfg.InboundInterceptionMode = "REDIRECT"
	cfg.OutboundIPRangesInclude = "*"
	cfg.InboundPortsInclude = "*"
	cfg.InboundPortsExclude = "15090,15021,15020"
	return cfg
}

// applyRuleByRule is the baseline: "iptables -t T -N C" per chain, then
// "iptables -t T -A/-I ..." per rule. Returns the processes started.
func applyRuleByRule(b *testing.B, bin string, rules []Rule) int64 {
	var n int64
	runIpt := func(args ...string) {
		n++
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			b.Fatalf("%s %v: %v: %s", bin, args, err, out)
		}
	}
	for _, table := range Tables(rules) {
		for _, chain := range ownChains(rules, table) {
			runIpt("-t", table, "-N", chain)
		}
	}
	for _, r := range rules {
		if r.Position > 0 {
			runIpt(append([]string{"-t", r.Table, "-I", r.Chain, strconv.Itoa(r.Position)}, r.Params...)...)
		} else {
			runIpt(append([]string{"-t", r.Table, "-A", r.Chain}, r.Params...)...)
		}
	}
	return n
}

// BenchmarkApplySidecarRulesNft times applying the same sidecar rules with
// the nftables backend (one nft -f transaction that replaces our tables,
// ns/op) against one iptables-restore apply of the IPv4 rules, measured in
// the same run (#23).
func BenchmarkApplySidecarRulesNft(b *testing.B) {
	enterNetnsB(b)
	if _, err := exec.LookPath("nft"); err != nil {
		b.Skip("nft not installed (Debian package nftables)")
	}
	cfg := sidecarBenchRules(b)
	rs, ipt := BuildNft(cfg), Build(cfg)
	log := testkit.TestLogger(b)
	n, err := NewNftApplier(log)
	if err != nil {
		b.Fatal(err)
	}
	a, err := NewApplier("", false, log)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var nftExecs int64
	restore := timeAgainst(b, func() error {
		before := n.Execs()
		err := n.Apply(ctx, rs)
		nftExecs += n.Execs() - before
		return err
	}, func() error { return n.Cleanup(ctx) },
		func() error { return a.Apply(ipt, false) }, func() error { return a.Cleanup(ipt) })
	nftNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	restoreNs := float64(restore.Nanoseconds()) / float64(b.N)
	b.ReportMetric(restoreNs, "iptables-restore-ns/op")
	b.ReportMetric(restoreNs/nftNs, "speedup-x")
	b.ReportMetric(float64(nftExecs)/float64(b.N), "nft-procs/op")
	rules := 0
	for _, r := range rs.Rules {
		rules += len(r)
	}
	b.ReportMetric(float64(rules), "rules")
}
