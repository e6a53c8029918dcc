package capture

import (
	"context"
	"log/slog"
	"os/exec"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

func requireNft(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (Debian package nftables)")
	}
}

func nftConfig(t testing.TB, mode string) RulesConfig {
	cfg := testRules(t)
	cfg.InboundPortsInclude, cfg.OutboundIPRangesInclude = "*", "*"
	cfg.InboundInterceptionMode = mode
	cfg.EnableIPv6 = true
	cfg.RedirectDNS, cfg.DNSServersV4 = true, []string{"127.0.0.53"}
	return cfg
}

// TestNftApplyReconcileClean drives the nft backend through a node's life in
// a fresh namespace: apply from nothing, re-run (the same single set of
// tables), switch TPROXY to REDIRECT (the mangle table goes, atomically), a
// failing apply (nothing of it lands, the previous rules stay), and a
// cleanup that removes exactly our tables and leaves a foreign one (#23).
func TestNftApplyReconcileClean(t *testing.T) {
	requireNft(t)
	if !inNetns(t) {
		return
	}
	sh(t, "ip", "link", "set", "lo", "up") // TPROXY's local route needs it
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	a, err := NewNftApplier(log)
	if err != nil {
		t.Fatal(err)
	}
	sh(t, "nft", "add table inet other; add chain inet other c; add rule inet other c counter accept")
	foreign := sh(t, "nft", "-s", "list", "table", "inet", "other")

	run := func(cfg RulesConfig, want Outcome) string {
		t.Helper()
		got, err := ExecuteNft(ctx, cfg, BuildNft(cfg), a, log)
		if err != nil {
			t.Fatalf("%s: %v", cfg.InboundInterceptionMode, err)
		}
		if got != want {
			t.Errorf("%s: outcome %q, want %q", cfg.InboundInterceptionMode, got, want)
		}
		st, err := a.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	tproxy := nftConfig(t, "TPROXY")
	if missing, err := a.Missing(ctx, BuildNft(tproxy)); err != nil || len(missing) != 3 {
		t.Errorf("before apply, Missing = %q, %v; want our three tables", missing, err)
	}
	first := run(tproxy, Applied)
	if missing, err := a.Missing(ctx, BuildNft(tproxy)); err != nil || len(missing) != 0 {
		t.Errorf("after apply, Missing = %q, %v; want nothing", missing, err)
	}
	// A rule deleted by hand is seen.
	sh(t, "nft", "flush", "chain", "inet", NftNatTable, nftRedirect)
	if missing, _ := a.Missing(ctx, BuildNft(tproxy)); len(missing) != 1 || !strings.Contains(missing[0], "istio-redirect has 0 rules, want 1") {
		t.Errorf("after a flush by hand, Missing = %q", missing)
	}
	first = run(tproxy, Reconciled)
	for _, table := range nftTables {
		if !strings.Contains(first, "table inet "+table+" {") {
			t.Errorf("after apply, table %s is missing:\n%s", table, first)
		}
	}
	for i := range 10 {
		if again := run(tproxy, Unchanged); again != first {
			t.Fatalf("re-run %d changed the tables:\n%s", i+1, testkit.LineDiff(first, again))
		}
	}

	redirect := run(nftConfig(t, "REDIRECT"), Reconciled)
	if strings.Contains(redirect, NftMangleTable) {
		t.Errorf("after the switch to REDIRECT the mangle table is still there:\n%s", redirect)
	}
	if strings.Contains(redirect, "tproxy") {
		t.Errorf("TPROXY rules left after the switch to REDIRECT:\n%s", redirect)
	}

	// A group nft cannot resolve fails the transaction at load: none of it
	// may land, not even the removal of the old tables that precedes it.
	bad := nftConfig(t, "TPROXY")
	bad.OwnerGroupsInclude = "no-such-group-23"
	if _, err := ExecuteNft(ctx, bad, BuildNft(bad), a, log); err == nil {
		t.Fatal("apply with an unknown group succeeded")
	}
	if st, _ := a.State(ctx); st != redirect {
		t.Errorf("a failed apply changed the tables:\n%s", testkit.LineDiff(redirect, st))
	}

	clean := nftConfig(t, "REDIRECT")
	clean.CleanupOnly = true
	if got, err := ExecuteNft(ctx, clean, NftRuleSet{}, a, log); err != nil || got != CleanedUp {
		t.Fatalf("cleanup: %q, %v", got, err)
	}
	if st, _ := a.State(ctx); st != "" {
		t.Errorf("tables of ours left after cleanup:\n%s", st)
	}
	if got := sh(t, "nft", "-s", "list", "table", "inet", "other"); got != foreign {
		t.Errorf("cleanup touched a foreign table:\n%s", testkit.LineDiff(foreign, got))
	}
	// Cleaning a clean node is not an error.
	if _, err := ExecuteNft(ctx, clean, NftRuleSet{}, a, log); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
}

func TestOurNftTables(t *testing.T) {
	listing := "table inet other {\n\tchain c {\n\t}\n}\n" +
		"table inet istio-proxy-raw {\n\tchain output {\n\t\tcounter jump istio-output-dns\n\t}\n}\n" +
		"table inet istio-proxy-nat {\n\tchain output {\n\t}\n}\n"
	want := "table inet istio-proxy-nat {\n\tchain output {\n\t}\n}\n" +
		"table inet istio-proxy-raw {\n\tchain output {\n\t\tcounter jump istio-output-dns\n\t}\n}\n"
	if got := ourNftTables(listing); got != want {
		t.Errorf("ourNftTables:\n%s", testkit.LineDiff(want, got))
	}
}
