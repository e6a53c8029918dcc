package capture

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"

	"sigs.k8s.io/knftables"
)

// ErrNoNft: the nft binary is missing or too old. Istio's images lacked it
// (istio#57978); the error says which package brings it.
var ErrNoNft = errors.New("native nftables is enabled, but the nft binary (Debian package nftables, v1.0.1 or newer) is not usable")

// NftApplier programs, reads and removes our nftables tables with the nft
// binary, through knftables (the library Istio uses). Every change is ONE
// nft transaction: the kernel commits all of it or none of it, so a failed
// apply leaves the previous state, never half a capture (#23).
type NftApplier struct {
	nft  knftables.Interface
	path string
	log  *slog.Logger
	// routes does the TPROXY policy routing, the same for both backends.
	routes *Applier
	// execs counts the nft processes this applier started (knftables' own
	// probes included), for the benchmark.
	execs atomic.Int64
}

// NewNftApplier finds nft and checks that it works and that we may change
// the ruleset (knftables runs nft --version and a check transaction).
func NewNftApplier(log *slog.Logger) (*NftApplier, error) {
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoNft, err)
	}
	nft, err := knftables.New("", "")
	if err != nil {
		if isPermission(err.Error()) {
			return nil, fmt.Errorf("%w (nft: %v)", ErrPermission, err)
		}
		return nil, fmt.Errorf("%w: %v", ErrNoNft, err)
	}
	a := &NftApplier{nft: nft, path: path, log: log, routes: &Applier{log: log}}
	a.execs.Add(2)
	return a, nil
}

// Backend names the backend, as the iptables Applier's Backend does.
func (a *NftApplier) Backend() string { return "nftables" }

// apply is Apply given the current State. Only tables that exist are
// deleted: a deletion makes the kernel's commit wait for an RCU grace
// period (about 15 ms here, three times a whole fresh apply). A table made
// by someone else between the listing and the transaction is still flushed
// by rs's own "flush table".
func (a *NftApplier) apply(ctx context.Context, rs NftRuleSet, state string) error {
	tx := a.nft.NewTransaction()
	for _, table := range nftTables {
		if strings.Contains(state, "table inet "+table+" {") {
			tx.Delete(&knftables.Table{Family: knftables.InetFamily, Name: table})
		}
	}
	rs.addTo(tx)
	return a.run(ctx, tx)
}

// Cleanup removes our three tables, and nothing else, in one transaction.
func (a *NftApplier) Cleanup(ctx context.Context) error {
	tx := a.nft.NewTransaction()
	nftRemoveAll(tx)
	return a.run(ctx, tx)
}

func (a *NftApplier) run(ctx context.Context, tx *knftables.Transaction) error {
	a.execs.Add(1)
	if err := a.nft.Run(ctx, tx); err != nil {
		if isPermission(err.Error()) {
			return fmt.Errorf("%w (nft: %v)", ErrPermission, err)
		}
		return fmt.Errorf("nft -f (one transaction, nothing applied): %w", err)
	}
	return nil
}

// State is what the kernel holds in our tables, as nft -s lists them (no
// counters), table by table in nftTables order; "" when none exists.
func (a *NftApplier) State(ctx context.Context) (string, error) {
	a.execs.Add(1)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, a.path, "-s", "list", "ruleset", "inet")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if isPermission(msg) {
			return "", fmt.Errorf("%w (nft list ruleset: %s)", ErrPermission, msg)
		}
		return "", fmt.Errorf("nft list ruleset: %v: %s", err, msg)
	}
	return ourNftTables(stdout.String()), nil
}

// ourNftTables keeps, from an "nft list ruleset" listing, the blocks of our
// tables ("table inet istio-proxy-nat {" to its closing "}").
func ourNftTables(listing string) string {
	blocks := map[string]string{}
	var name string
	var cur strings.Builder
	for _, l := range strings.SplitAfter(listing, "\n") {
		if t, ok := strings.CutPrefix(l, "table inet "); ok && name == "" {
			name = strings.TrimSuffix(strings.TrimSpace(t), " {")
			cur.Reset()
		}
		if name == "" {
			continue
		}
		cur.WriteString(l)
		if strings.TrimRight(l, "\n") == "}" {
			if slices.Contains(nftTables, name) {
				blocks[name] = cur.String()
			}
			name = ""
		}
	}
	var out strings.Builder
	for _, t := range nftTables {
		out.WriteString(blocks[t])
	}
	return out.String()
}

// ExecuteNft is istio-iptables --native-nftables' run. Istio's backend
// flushes and rebuilds its tables on every run, so there is no separate
// reconcile: every apply is the atomic replace, and the outcome says what it
// found (nothing: applied; the same rules: unchanged; other rules:
// reconciled). --reconcile and --force-apply change nothing here.
func ExecuteNft(ctx context.Context, cfg RulesConfig, rs NftRuleSet, a *NftApplier, log *slog.Logger) (Outcome, error) {
	if cfg.CleanupOnly {
		return CleanedUp, errors.Join(a.Cleanup(ctx), a.routes.CleanupRouting(cfg))
	}
	if cfg.SkipRuleApply {
		return NotApplied, nil
	}
	before, err := a.State(ctx)
	if err != nil {
		return "", err
	}
	if err := a.apply(ctx, rs, before); err != nil {
		return "", err
	}
	after, err := a.State(ctx)
	if err != nil {
		return "", err
	}
	outcome := Applied
	switch {
	case before == "":
	case before == after:
		log.Info("capture tables already in place; replaced by the same rules")
		outcome = Unchanged
	default:
		log.Info("existing capture tables differed; replaced atomically")
		outcome = Reconciled
	}
	if err := a.routes.SetupRouting(cfg); err != nil {
		return "", err
	}
	return outcome, nil
}

// Missing lists, readably, what of rs the kernel lacks: tables, chains, or
// chains holding a different number of rules (one nft list). It is the nft
// backend's counterpart of Applier.MissingChains, for the sidecar's check
// of what an init container or the CNI plugin programmed; empty means in
// place.
func (a *NftApplier) Missing(ctx context.Context, rs NftRuleSet) ([]string, error) {
	st, err := a.State(ctx)
	if err != nil {
		return nil, err
	}
	have := nftRuleCounts(st)
	var missing []string
	for _, table := range rs.tables() {
		if have[table] == nil {
			missing = append(missing, "nftables table inet "+table)
			continue
		}
		want := map[string]int{}
		for _, r := range rs.Rules[table] {
			want[r.Chain]++
		}
		for _, c := range nftChains[table] {
			n, ok := have[table][c.Name]
			switch {
			case want[c.Name] == 0:
			case !ok:
				missing = append(missing, fmt.Sprintf("nftables chain %s/%s", table, c.Name))
			case n != want[c.Name]:
				missing = append(missing, fmt.Sprintf("nftables chain %s/%s has %d rules, want %d", table, c.Name, n, want[c.Name]))
			}
		}
	}
	return missing, nil
}

// nftRuleCounts reads an nft -s listing of our tables: table -> chain ->
// number of rules (a base chain's "type ... hook ..." line is not a rule).
func nftRuleCounts(listing string) map[string]map[string]int {
	out := map[string]map[string]int{}
	var table, chain string
	for _, l := range strings.Split(listing, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "table inet "):
			table = strings.TrimSuffix(strings.TrimPrefix(l, "table inet "), " {")
			out[table] = map[string]int{}
		case strings.HasPrefix(l, "chain "):
			chain = strings.TrimSuffix(strings.TrimPrefix(l, "chain "), " {")
			out[table][chain] = 0
		case l == "}":
			if chain == "" {
				table = ""
			}
			chain = ""
		case l == "" || chain == "" || strings.HasPrefix(l, "type "):
		default:
			out[table][chain]++
		}
	}
	return out
}
