package capture

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/thejerf/suture/v4"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// TestKernelServiceNft: with NATIVE_NFTABLES the sidecar checks our nft
// tables (Degraded naming what is missing, Ready when in place), and in VM
// mode the service programs them, rebuilds them after a flush on the next
// check, and removes them when stopped (#23).
func TestKernelServiceNft(t *testing.T) {
	requireNft(t)
	if !inNetns(t) {
		return
	}
	sh(t, "ip", "link", "set", "lo", "up")
	ctx := context.Background()
	capCfg := sidecarConfig(t, false, "")
	capCfg.NativeNftables = true
	rs := BuildNft(capCfg)
	a, err := NewNftApplier(testkit.TestLogger(t))
	if err != nil {
		t.Fatal(err)
	}

	health := messages.NewCell[messages.Health]()
	sidecar := mustNew(t, Config{Mode: Sidecar, Rules: capCfg}, messages.NewRuntime(Name, health, nil, nil, testkit.TestLogger(t)))
	check := func(what string, want messages.HealthState, reason string) {
		t.Helper()
		if err := sidecar.Serve(ctx); !errors.Is(err, suture.ErrDoNotRestart) {
			t.Fatalf("%s: Serve = %v, want ErrDoNotRestart", what, err)
		}
		if h, _ := health.Get(); h.State != want || !strings.Contains(h.Reason, reason) {
			t.Errorf("%s: %+v; want %s naming %q", what, h, want, reason)
		}
	}
	check("without tables", messages.Degraded, "nftables table inet istio-proxy-nat")
	if err := a.Apply(ctx, rs); err != nil {
		t.Fatal(err)
	}
	check("with tables", messages.Ready, "nftables")
	// With neither flag, the sidecar checks the backend the node holds.
	detect := capCfg
	detect.NativeNftables = false
	sidecar = mustNew(t, Config{Mode: Sidecar, Rules: detect}, messages.NewRuntime(Name, health, nil, nil, testkit.TestLogger(t)))
	check("with tables, neither flag", messages.Ready, "nftables")
	ipt, err := NewApplier("", false, testkit.TestLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := ipt.Apply(Build(detect), false); err != nil {
		t.Fatal(err)
	}
	check("with rules of both kinds", messages.Degraded, "both ISTIO_* iptables chains and nftables tables")
	if err := ipt.CleanState(Build(detect)); err != nil {
		t.Fatal(err)
	}
	sidecar = mustNew(t, Config{Mode: Sidecar, Rules: capCfg}, messages.NewRuntime(Name, health, nil, nil, testkit.TestLogger(t)))
	sh(t, "nft", "flush", "chain", "inet", NftNatTable, nftOutputChain)
	check("with a chain flushed", messages.Degraded, "istio-proxy-nat/istio-output has 0 rules")
	if err := a.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}

	clock := testkit.NewManualClock()
	vm := mustNew(t, Config{Mode: VM, Rules: capCfg, CheckInterval: time.Hour}, messages.NewRuntime(Name, health, clock, nil, testkit.TestLogger(t)))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- vm.Serve(runCtx) }()
	inPlace := func(what string) {
		t.Helper()
		testkit.WaitFor(t, what, func() bool {
			m, err := a.Missing(ctx, rs)
			return err == nil && len(m) == 0
		})
	}
	inPlace("tables programmed at start")
	sh(t, "nft", "delete", "table", "inet", NftNatTable)
	clock.AdvanceToNext(t)
	inPlace("tables rebuilt on the next check")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Serve after cancel = %v, want context.Canceled", err)
	}
	if st, _ := a.State(ctx); st != "" {
		t.Errorf("tables left after stop:\n%s", st)
	}
}
