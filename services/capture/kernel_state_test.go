package capture

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// Kernel tests of state handling: verify/reconcile, failed apply, clean
// state, the validator. Each runs in its own namespace (see netns_test.go).

// TestKernelVerifyReconcile follows Istio's run_linux_test: apply, then
// foreign rules are no delta, a changed ISTIO_* chain is; re-running without
// --reconcile fails, with it succeeds; --force-apply fails on existing
// chains; cleanup leaves no residue.
func TestKernelVerifyReconcile(t *testing.T) {
	if !inNetns(t) {
		return
	}
	sh(t, "ip", "link", "set", "lo", "up")
	log := testkit.TestLogger(t)
	cfg := sidecarConfig(t, true, "")
	cfg.ExcludeInterfaces = "eth9"
	cfg.RerouteVirtualInterfaces = "virt0"
	rs := Build(cfg)
	a, err := NewApplier("", true, log)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := Execute(cfg, rs, a, log); err != nil || out != Applied {
		t.Fatalf("apply = %v, %v", out, err)
	}
	if residue, delta, err := a.Verify(rs); err != nil || !residue || delta {
		t.Fatalf("after apply: residue=%v delta=%v err=%v; want residue, no delta", residue, delta, err)
	}
	// A re-check that finds the rules in place (VM mode's every
	// CheckInterval) says so at debug level only: no journal line a check.
	recheck := testkit.NewLogBuffer(t)
	if out, err := Execute(cfg, rs, a, recheck.Logger()); err != nil || out != Unchanged {
		t.Fatalf("re-check = %v, %v; want %v", out, err, Unchanged)
	}
	if strings.Contains(recheck.String(), "level=INFO") {
		t.Errorf("a re-check that changed nothing logged at INFO:\n%s", recheck)
	}
	force := cfg
	force.ForceApply = true
	if _, err := Execute(force, rs, a, log); err == nil {
		t.Errorf("--force-apply over existing chains succeeded; Istio's fails")
	}
	sh(t, "iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "9999", "-j", "ACCEPT")
	if _, delta, _ := a.Verify(rs); delta {
		t.Errorf("a foreign rule in nat OUTPUT counted as delta")
	}
	sh(t, "iptables", "-t", "nat", "-A", ChainInbound, "-p", "tcp", "--dport", "7777", "-j", "RETURN")
	if _, delta, _ := a.Verify(rs); !delta {
		t.Errorf("an extra rule in ISTIO_INBOUND was not a delta")
	}
	if _, err := Execute(cfg, rs, a, log); err == nil {
		t.Errorf("re-run over drifted rules without --reconcile succeeded")
	}
	// Reconcile to a different config: the inbound exclusions change.
	changed := cfg
	changed.InboundPortsExclude = "15021"
	changed.Reconcile = true
	crs := Build(changed)
	if out, err := Execute(changed, crs, a, log); err != nil || out != Reconciled {
		t.Fatalf("reconcile = %v, %v", out, err)
	}
	if residue, delta, err := a.Verify(crs); err != nil || !residue || delta {
		t.Errorf("after reconcile: residue=%v delta=%v err=%v", residue, delta, err)
	}
	nat := saveState(t, false)["nat"]
	pre := strings.Join(nat.Rules["PREROUTING"], "\n")
	if strings.Count(pre, "-i virt0 -j RETURN") != 1 || strings.Count(pre, "-i virt0 -j ISTIO_REDIRECT") != 1 {
		t.Errorf("after reconcile PREROUTING = %v; want each virt0 rule once", nat.Rules["PREROUTING"])
	}
	if got := strings.Join(nat.Rules["OUTPUT"], "\n"); strings.Count(got, ChainOutput) != 1 || !strings.Contains(got, "9999") {
		t.Errorf("after reconcile nat OUTPUT = %v; want one jump and the foreign rule kept", nat.Rules["OUTPUT"])
	}
	changed.CleanupOnly = true
	if _, err := Execute(changed, crs, a, log); err != nil {
		t.Fatal(err)
	}
	if st4, st6 := saveState(t, false), saveState(t, true); st4.Residue() || st6.Residue() {
		t.Errorf("residue after cleanup:\n%s\n%s", sh(t, "iptables-save"), sh(t, "ip6tables-save"))
	}
	if !strings.Contains(sh(t, "iptables-save", "-t", "nat"), "9999") {
		t.Errorf("cleanup removed a foreign rule")
	}
}

// TestKernelFailedApplyLeavesNothing: the IPv6 restore fails after the IPv4
// one committed; nothing of ours may remain.
func TestKernelFailedApplyLeavesNothing(t *testing.T) {
	if !inNetns(t) {
		return
	}
	log := testkit.TestLogger(t)
	cfg := sidecarConfig(t, true, "")
	rs := Build(cfg)
	rs.V6 = append(rs.V6, Rule{Table: "nat", Chain: ChainOutput, Params: []string{"-j", "NO_SUCH_TARGET_X"}})
	a, err := NewApplier("", true, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Execute(cfg, rs, a, log); err == nil {
		t.Fatal("apply with a broken IPv6 rule succeeded")
	}
	if st4, st6 := saveState(t, false), saveState(t, true); st4.Residue() || st6.Residue() {
		t.Errorf("residue after failed apply:\n%s\n%s", sh(t, "iptables-save"), sh(t, "ip6tables-save"))
	}
}

// TestKernelCleanState: clean-iptables removes our chains and jumps (any
// config, both families) and keeps foreign rules and chains.
func TestKernelCleanState(t *testing.T) {
	if !inNetns(t) {
		return
	}
	log := testkit.TestLogger(t)
	sh(t, "ip", "link", "set", "lo", "up")
	sh(t, "iptables", "-t", "nat", "-N", "FOREIGN")
	sh(t, "iptables", "-t", "nat", "-A", "OUTPUT", "-m", "comment", "--comment", "keep me", "-j", "FOREIGN")
	sh(t, "ip6tables", "-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
	before4, before6 := saveState(t, false).Normalized(), saveState(t, true).Normalized()
	cfg := sidecarConfig(t, true, "TPROXY")
	cfg.DropInvalid = true
	a, err := NewApplier("", true, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Execute(cfg, Build(cfg), a, log); err != nil {
		t.Fatal(err)
	}
	if err := a.CleanState(Build(cfg)); err != nil {
		t.Fatal(err)
	}
	if after := saveState(t, false).Normalized(); fmt.Sprint(after) != fmt.Sprint(before4) {
		t.Errorf("IPv4 after clean: %v\nbefore: %v", after, before4)
	}
	if after := saveState(t, true).Normalized(); fmt.Sprint(after) != fmt.Sprint(before6) {
		t.Errorf("IPv6 after clean: %v\nbefore: %v", after, before6)
	}
}

// TestKernelValidator: Istio's validator (run as the proxy UID, as the CNI's
// validation container is) passes once the rules are in, and fails without.
func TestKernelValidator(t *testing.T) {
	if !inNetns(t) {
		return
	}
	tp := setupTopology(t)
	run := func(timeout string) string {
		cmd := exec.Command(tp.bin)
		cmd.Env = append(os.Environ(), envHelper+"=validate", envArgs+"="+timeout)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1337, Gid: 1337}}
		out, _ := cmd.CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	if out := run("1500ms"); !strings.Contains(out, "probe connection was not redirected") {
		t.Errorf("validator without rules: %q; want a failure", out)
	}
	cfg := sidecarConfig(t, false, "")
	a, err := NewApplier("", false, testkit.TestLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Execute(cfg, Build(cfg), a, testkit.TestLogger(t)); err != nil {
		t.Fatal(err)
	}
	expect(t, "validator with rules", run("10s"), "validated")
}
