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
	cfg := DefaultRules()
	cfg.InboundInterceptionMode = "REDIRECT"
	cfg.OutboundIPRangesInclude = "*"
	cfg.InboundPortsInclude = "*"
	cfg.InboundPortsExclude = "15090,15021,15020"
	rs := Build(cfg)
	a, err := NewApplier("", false, testkit.TestLogger(b))
	if err != nil {
		b.Fatal(err)
	}
	var baseline time.Duration
	var restoreExecs, baselineExecs int64
	b.ResetTimer()
	for range b.N {
		before := a.Execs()
		if err := a.Apply(rs, false); err != nil {
			b.Fatal(err)
		}
		restoreExecs += a.Execs() - before
		b.StopTimer()
		if err := a.Cleanup(rs); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		baselineExecs += applyRuleByRule(b, a.v4.binary, rs.V4)
		baseline += time.Since(start)
		if err := a.Cleanup(rs); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	restoreNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	baselineNs := float64(baseline.Nanoseconds()) / float64(b.N)
	b.ReportMetric(baselineNs, "rule-by-rule-ns/op")
	b.ReportMetric(baselineNs/restoreNs, "speedup-x")
	b.ReportMetric(float64(restoreExecs)/float64(b.N), "restore-procs/op")
	b.ReportMetric(float64(baselineExecs)/float64(b.N), "rule-by-rule-procs/op")
	b.ReportMetric(float64(len(rs.V4)), "rules")
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
	cfg := DefaultRules()
	cfg.InboundInterceptionMode = "REDIRECT"
	cfg.OutboundIPRangesInclude = "*"
	cfg.InboundPortsInclude = "*"
	cfg.InboundPortsExclude = "15090,15021,15020"
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
	var restore time.Duration
	var nftExecs int64
	b.ResetTimer()
	for range b.N {
		before := n.Execs()
		if err := n.Apply(ctx, rs); err != nil {
			b.Fatal(err)
		}
		nftExecs += n.Execs() - before
		b.StopTimer()
		if err := n.Cleanup(ctx); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := a.Apply(ipt, false); err != nil {
			b.Fatal(err)
		}
		restore += time.Since(start)
		if err := a.Cleanup(ipt); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
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
