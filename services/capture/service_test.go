package capture

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/thejerf/suture/v4"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestConfigValidate(t *testing.T) {
	cfg := Config{Mode: Mode(7), Rules: testRules(t)}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Mode 7") {
		t.Errorf("bad mode: %v", err)
	}
	cfg = Config{Mode: VM, Rules: testRules(t)}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "MESHAGENT_CAPTURE_CHECK_INTERVAL") {
		t.Errorf("VM mode without a check interval: %v", err)
	}
	cfg.CheckInterval = time.Hour
	cfg.Rules.ProxyPort = "x"
	if _, err := New(cfg, Inputs{}, Outputs{}, messages.NewRuntime(Name, messages.NewCell[messages.Health](), nil, nil, testkit.TestLogger(t))); err == nil ||
		!strings.Contains(err.Error(), "--envoy-port") {
		t.Errorf("New with bad config: %v", err)
	}
	s, err := New(Config{Rules: testRules(t)}, Inputs{}, Outputs{}, messages.NewRuntime(Name, messages.NewCell[messages.Health](), nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	if s.String() != "capture" {
		t.Errorf("String() = %q", s.String())
	}
}

// TestKernelServiceSidecar: without rules the service reports Degraded
// naming what is missing; with them Ready; both times it stops for good.
func TestKernelServiceSidecar(t *testing.T) {
	if !inNetns(t) {
		return
	}
	sh(t, "ip", "link", "set", "lo", "up")
	health := messages.NewCell[messages.Health]()
	cfg := Config{Mode: Sidecar, Rules: sidecarConfig(t, false, "")}
	svc := mustNew(t, cfg, messages.NewRuntime(Name, health, nil, nil, testkit.TestLogger(t)))
	if err := svc.Serve(context.Background()); !errors.Is(err, suture.ErrDoNotRestart) {
		t.Fatalf("Serve = %v, want ErrDoNotRestart", err)
	}
	h, _ := health.Get()
	if h.State != messages.Degraded || !strings.Contains(h.Reason, "ISTIO_OUTPUT") || !strings.Contains(h.Reason, "istio-init") || h.Service != "capture" {
		t.Errorf("without rules: %+v; want Degraded naming ISTIO_OUTPUT and who installs the rules", h)
	}
	a, err := NewApplier("", false, testkit.TestLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Apply(Build(cfg.Rules), false); err != nil {
		t.Fatal(err)
	}
	if err := svc.Serve(context.Background()); !errors.Is(err, suture.ErrDoNotRestart) {
		t.Fatalf("Serve = %v", err)
	}
	if h, _ := health.Get(); h.State != messages.Ready {
		t.Errorf("with rules: %+v; want Ready", h)
	}
	// One rule gone: Degraded, naming it.
	sh(t, "iptables", "-t", "nat", "-D", ChainInbound, "-p", "tcp", "-j", ChainInRedirect)
	svc.Serve(context.Background())
	if h, _ := health.Get(); h.State != messages.Degraded || !strings.Contains(h.Reason, "ISTIO_INBOUND") {
		t.Errorf("with a rule deleted: %+v; want Degraded naming ISTIO_INBOUND", h)
	}
	// Every chain with its rule count, but one rule changed: only the exact
	// check (iptables -C), which runs after the first verdict, can see it.
	sh(t, "iptables", "-t", "nat", "-A", ChainInbound, "-p", "tcp", "-j", ChainInRedirect)
	sh(t, "iptables", "-t", "nat", "-R", ChainInbound, "1", "-p", "tcp", "--dport", "1", "-j", "RETURN")
	svc.Serve(context.Background())
	if h, _ := health.Get(); h.State != messages.Degraded || !strings.Contains(h.Reason, "rule -t nat -A "+ChainInbound) {
		t.Errorf("with a rule changed: %+v; want Degraded naming the rule", h)
	}
}

// TestKernelServiceVM: applies at start, re-applies after a flush on the
// next check, removes everything when cancelled.
func TestKernelServiceVM(t *testing.T) {
	if !inNetns(t) {
		return
	}
	sh(t, "ip", "link", "set", "lo", "up")
	health := messages.NewCell[messages.Health]()
	clock := testkit.NewManualClock()
	cfg := Config{Mode: VM, Rules: sidecarConfig(t, false, ""), CheckInterval: time.Hour}
	svc := mustNew(t, cfg, messages.NewRuntime(Name, health, clock, nil, testkit.TestLogger(t)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	_, _, changed := health.Watch()
	go func() { done <- svc.Serve(ctx) }()
	waitReady := func(what string) {
		t.Helper()
		for {
			select {
			case <-changed:
			case err := <-done:
				t.Fatalf("%s: Serve returned %v", what, err)
			case <-time.After(20 * time.Second):
				t.Fatalf("%s: no Ready", what)
			}
			var h messages.Health
			h, _, changed = health.Watch()
			if h.State == messages.Ready {
				return
			}
		}
	}
	waitReady("start")
	a, err := NewApplier("", false, testkit.TestLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rs := Build(cfg.Rules)
	if m, err := a.Missing(rs); err != nil || len(m) > 0 {
		t.Fatalf("after start missing %v (%v)", m, err)
	}
	// Someone flushes the nat table.
	sh(t, "iptables", "-t", "nat", "-F")
	if m, _ := a.Missing(rs); len(m) == 0 {
		t.Fatal("flush did not remove rules")
	}
	// The next check re-applies. Health stays Ready throughout (the
	// reporter drops the repeat), so watch the rules themselves.
	clock.AdvanceToNext(t)
	deadline := time.Now().Add(20 * time.Second)
	for {
		m, err := a.Missing(rs)
		if err == nil && len(m) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after re-check missing %v (%v)", m, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if strings.Count(sh(t, "iptables-save", "-t", "nat"), "-A OUTPUT -j ISTIO_OUTPUT") != 1 {
		t.Errorf("jump duplicated after re-apply:\n%s", sh(t, "iptables-save", "-t", "nat"))
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Serve after cancel = %v, want context.Canceled", err)
	}
	if st := saveState(t, false); st.Residue() {
		t.Errorf("rules left after stop:\n%s", sh(t, "iptables-save"))
	}
}

// TestKernelServiceSidecarUnprivileged: a sidecar without CAP_NET_ADMIN
// cannot read the rules; that is expected, so it is Ready ("not verified"),
// at once: it runs no iptables-save that could only be refused (#36).
func TestKernelServiceSidecarUnprivileged(t *testing.T) {
	if !inNetns(t) {
		return
	}
	tp := setupTopology(t)
	cmd := exec.Command(tp.bin)
	cmd.Env = append(os.Environ(), envHelper+"=sidecar")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1337, Gid: 1337}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	parts := strings.SplitN(strings.TrimSpace(string(out)), "|", 3)
	if len(parts) != 3 || !strings.Contains(parts[0], "should not be restarted") || parts[1] != messages.Ready.String() ||
		!strings.Contains(parts[2], "not verified") || !strings.Contains(parts[2], "permission denied") || !strings.Contains(parts[2], "nothing was run") {
		t.Errorf("unprivileged sidecar: %q; want ErrDoNotRestart, Ready, not verified: permission denied, nothing run", out)
	}
}

// mustNew is New for a config the test knows is good.
func mustNew(t testing.TB, cfg Config, rt messages.Runtime) *Service {
	t.Helper()
	svc, err := New(cfg, Inputs{}, Outputs{}, rt)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}
