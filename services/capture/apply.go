package capture

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/coreos/go-iptables/iptables"
)

var (
	// ErrNoIptables: the iptables binaries are not installed.
	ErrNoIptables = errors.New("iptables not found (install the iptables package)")
	// ErrPermission: the caller may not change the firewall.
	ErrPermission = errors.New("permission denied: changing iptables needs root (CAP_NET_ADMIN)")
	// ErrDrift: our chains exist but differ from the config, and --reconcile is off.
	ErrDrift = errors.New("existing ISTIO_* rules differ from the requested ones (use --reconcile to replace them)")
)

// family is one address family's iptables binaries.
type family struct {
	v6      bool
	binary  string // iptables-nft, iptables-legacy, iptables, or the ip6 ones
	save    string
	restore string
	legacy  bool
	ipt     *iptables.IPTables
}

func (f *family) String() string {
	if f.v6 {
		return "IPv6"
	}
	return "IPv4"
}

// Applier programs, checks and removes the rules with the host's iptables.
type Applier struct {
	v4, v6 *family // v6 is nil when ip6tables is missing
	log    *slog.Logger
	// execs counts the processes this Applier started (save, restore and
	// go-iptables calls), for the benchmark.
	execs atomic.Int64
}

// NewApplier finds the iptables binaries as istio-iptables does: a forced
// choice, else legacy if it already holds rules, else nft, else plain
// "iptables". needV6 makes a missing ip6tables an error (else a warning).
func NewApplier(force string, needV6 bool, log *slog.Logger) (*Applier, error) {
	a := &Applier{log: log}
	var err error
	if a.v4, err = a.detect(force, false); err != nil {
		return nil, err
	}
	if a.v6, err = a.detect(force, true); err != nil {
		if needV6 {
			return nil, err
		}
		log.Warn("ip6tables not usable; IPv6 rules will not be checked", "error", err)
		a.v6 = nil
	}
	return a, nil
}

// Execs is the number of processes started so far.
func (a *Applier) Execs() int64 { return a.execs.Load() }

// Backend names the IPv4 binary in use (e.g. "iptables-nft").
func (a *Applier) Backend() string { return a.v4.binary }

func (a *Applier) detect(force string, v6 bool) (*family, error) {
	base := "iptables"
	if v6 {
		base = "ip6tables"
	}
	var candidates []string
	switch force {
	case "legacy":
		candidates = []string{base + "-legacy"}
	case "nft":
		candidates = []string{base + "-nft"}
	default:
		if _, err := exec.LookPath(base + "-legacy-save"); err == nil {
			a.execs.Add(1)
			out, _ := exec.Command(base + "-legacy-save").Output()
			if strings.Count(strings.TrimSpace(string(out)), "\n") >= 2 {
				candidates = append(candidates, base+"-legacy")
			}
		}
		candidates = append(candidates, base+"-nft", base)
	}
	for _, bin := range candidates {
		path, err := exec.LookPath(bin)
		if err != nil {
			continue
		}
		f := &family{v6: v6, binary: bin, legacy: strings.HasSuffix(bin, "-legacy")}
		f.save, f.restore = bin+"-save", bin+"-restore"
		if bin == base {
			f.save, f.restore = base+"-save", base+"-restore"
		}
		for _, p := range []*string{&f.save, &f.restore} {
			if *p, err = exec.LookPath(*p); err != nil {
				return nil, fmt.Errorf("%w: %v", ErrNoIptables, err)
			}
		}
		proto := iptables.ProtocolIPv4
		if v6 {
			proto = iptables.ProtocolIPv6
		}
		a.execs.Add(1) // go-iptables runs "--version"
		if f.ipt, err = iptables.New(iptables.IPFamily(proto), iptables.Path(path), iptables.Timeout(30)); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrNoIptables, bin, err)
		}
		return f, nil
	}
	return nil, fmt.Errorf("%w: none of %s in PATH", ErrNoIptables, strings.Join(candidates, ", "))
}

func (a *Applier) families(rs RuleSet) []struct {
	f     *family
	rules []Rule
} {
	out := []struct {
		f     *family
		rules []Rule
	}{{a.v4, rs.V4}}
	if rs.IPv6 && a.v6 != nil {
		out = append(out, struct {
			f     *family
			rules []Rule
		}{a.v6, rs.V6})
	}
	return out
}

// Save dumps one family's current state.
func (a *Applier) Save(v6 bool) (string, error) {
	f := a.v4
	if v6 {
		if a.v6 == nil {
			return "", fmt.Errorf("%w: ip6tables", ErrNoIptables)
		}
		f = a.v6
	}
	return a.run(f.save, "", nil)
}

// run executes one binary (stdin optional) and classifies failures.
func (a *Applier) run(bin, stdin string, args []string) (string, error) {
	a.execs.Add(1)
	cmd := exec.Command(bin, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if isPermission(msg) {
			return "", fmt.Errorf("%w (%s: %s)", ErrPermission, bin, msg)
		}
		return "", fmt.Errorf("%s %s: %v: %s", bin, strings.Join(args, " "), err, msg)
	}
	return stdout.String(), nil
}

func isPermission(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "permission denied") || strings.Contains(m, "you must be root") ||
		strings.Contains(m, "operation not permitted")
}

// Verify is istio-iptables' VerifyIptablesState: residue when any ISTIO_*
// chain or rule exists (either family); delta when an expected chain is
// missing or has a different rule count, or an expected rule is missing
// (iptables -C). Rules added by others to built-in chains are not a delta;
// order is not checked.
func (a *Applier) Verify(rs RuleSet) (residue, delta bool, err error) {
	states := map[*family]SaveState{}
	for _, f := range []*family{a.v4, a.v6} {
		if f == nil {
			continue
		}
		out, err := a.run(f.save, "", nil)
		if err != nil {
			return false, false, err
		}
		states[f] = ParseSave(out)
		residue = residue || states[f].Residue()
	}
	if !residue {
		return false, true, nil
	}
	for _, fr := range a.families(rs) {
		st := states[fr.f]
		counts := map[[2]string]int{}
		for _, r := range fr.rules {
			if !isBuiltin(r.Chain) {
				counts[[2]string{r.Table, r.Chain}]++
			}
		}
		for _, table := range Tables(fr.rules) {
			for _, chain := range ownChains(fr.rules, table) {
				t := st[table]
				if t == nil || !slices.Contains(t.Chains, chain) || len(t.Rules[chain]) != counts[[2]string{table, chain}] {
					return true, true, nil
				}
			}
		}
		for _, r := range fr.rules {
			a.execs.Add(1)
			ok, err := fr.f.ipt.Exists(r.Table, r.Chain, r.Params...)
			if err != nil {
				return true, false, classify(err)
			}
			if !ok {
				return true, true, nil
			}
		}
	}
	return true, false, nil
}

func classify(err error) error {
	if err != nil && isPermission(err.Error()) {
		return fmt.Errorf("%w (%v)", ErrPermission, err)
	}
	return err
}

// Apply programs the rules with ONE iptables-restore --noflush per family.
// If a restore fails and there was nothing of ours before, whatever part
// was committed is removed again, so a failed apply leaves nothing behind.
func (a *Applier) Apply(rs RuleSet, hadResidue bool) error {
	for _, fr := range a.families(rs) {
		input := RestoreInput(fr.rules)
		if input == "" {
			continue
		}
		if _, err := a.run(fr.f.restore, input, restoreArgs(fr.f)); err != nil {
			if !hadResidue {
				if cerr := a.Cleanup(rs); cerr != nil {
					a.log.Warn("cleanup after failed apply", "error", cerr)
				}
			}
			return fmt.Errorf("apply %s rules: %w", fr.f, err)
		}
	}
	return nil
}

func restoreArgs(f *family) []string {
	if f.legacy {
		return []string{"--noflush", "--wait=30"}
	}
	return []string{"--noflush"}
}

// Reconcile replaces whatever ISTIO_* state exists with rs in ONE restore
// per family. Each table block declares every chain (":CHAIN - [0:0]"
// creates a missing chain and flushes an existing one), deletes the old
// jumps into our chains from built-in chains, adds the new rules, and
// deletes chains no longer wanted. iptables-restore commits a table
// atomically (nft: the whole input), so traffic never sees a half-built or
// missing capture: no guardrail DROP rules are needed.
func (a *Applier) Reconcile(rs RuleSet) error {
	for _, f := range []*family{a.v4, a.v6} {
		if f == nil {
			continue
		}
		var rules []Rule
		if f == a.v4 {
			rules = rs.V4
		} else if rs.IPv6 {
			rules = rs.V6
		}
		out, err := a.run(f.save, "", nil)
		if err != nil {
			return err
		}
		// Our non-jump rules in built-in chains (interface RETURNs) would be
		// added twice: delete the ones present in the same transaction.
		var present []Rule
		for _, r := range rules {
			if isBuiltin(r.Chain) && !strings.HasPrefix(r.Target(), ChainPrefix) {
				a.execs.Add(1)
				if ok, err := f.ipt.Exists(r.Table, r.Chain, r.Params...); err == nil && ok {
					present = append(present, r)
				}
			}
		}
		input := ReconcileInput(ParseSave(out), rules, present)
		if input == "" {
			continue
		}
		if _, err := a.run(f.restore, input, restoreArgs(f)); err != nil {
			return fmt.Errorf("reconcile %s rules: %w", f, err)
		}
	}
	return nil
}

// ReconcileInput is the restore input that turns state st into rules.
// present are rules of ours in built-in chains that exist already and do not
// jump to our chains (deleted before being added again).
func ReconcileInput(st SaveState, rules, present []Rule) string {
	tables := Tables(rules)
	for name := range st {
		if len(st.OwnChains(name)) > 0 || len(st.JumpsToOwn(name)) > 0 {
			if !slices.Contains(tables, name) {
				tables = append(tables, name)
			}
		}
	}
	slices.Sort(tables)
	var sb strings.Builder
	for _, table := range tables {
		want := ownChains(rules, table)
		existing := st.OwnChains(table)
		sb.WriteString("*" + table + "\n")
		for _, c := range want {
			sb.WriteString(":" + c + " - [0:0]\n")
		}
		for _, c := range existing {
			if !slices.Contains(want, c) {
				sb.WriteString(":" + c + " - [0:0]\n") // flush; deleted below
			}
		}
		for _, j := range st.JumpsToOwn(table) {
			sb.WriteString("-D " + j.Chain + " " + quoteArgs(j.Params) + "\n")
		}
		for _, r := range present {
			if r.Table == table {
				sb.WriteString("-D " + r.Chain + " " + strings.Join(r.Params, " ") + "\n")
			}
		}
		for _, r := range rules {
			if r.Table == table {
				sb.WriteString(r.Spec() + "\n")
			}
		}
		for _, c := range existing {
			if !slices.Contains(want, c) {
				sb.WriteString("-X " + c + "\n")
			}
		}
		sb.WriteString("COMMIT\n")
	}
	return sb.String()
}

func quoteArgs(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \t\"") {
			a = `"` + strings.ReplaceAll(a, `"`, `\"`) + `"`
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

// Cleanup removes the rules rs describes, as istio-iptables --cleanup-only
// does: config-derived, in reverse order, each rule in a built-in chain or
// jumping to one of ours deleted if present, then our chains flushed and
// deleted. Errors for absent rules are ignored; other errors are returned.
func (a *Applier) Cleanup(rs RuleSet) error {
	var errs []error
	for _, fr := range a.families(rs) {
		ipt := fr.f.ipt
		for i := len(fr.rules) - 1; i >= 0; i-- {
			r := fr.rules[i]
			if !isBuiltin(r.Chain) && !strings.HasPrefix(r.Target(), ChainPrefix) {
				continue
			}
			a.execs.Add(1)
			if err := ipt.DeleteIfExists(r.Table, r.Chain, r.Params...); err != nil && !notExist(err) {
				errs = append(errs, classify(err))
			}
		}
		for _, table := range Tables(fr.rules) {
			errs = append(errs, a.dropChains(fr.f, table, ownChains(fr.rules, table)))
		}
	}
	return errors.Join(errs...)
}

// CleanState removes every ISTIO_* chain and every jump to one, in both
// families, whatever config created them (meshagent clean-iptables). Rules
// of ours in built-in chains that jump nowhere (TPROXY's MARK/CONNMARK,
// interface RETURNs) cannot be told apart from foreign ones by looking, so
// they are removed only when they exactly match a rule of the given rule
// sets (the config's): nothing else is touched.
func (a *Applier) CleanState(known ...RuleSet) error {
	var errs []error
	for _, f := range []*family{a.v4, a.v6} {
		if f == nil {
			continue
		}
		for _, rs := range known {
			rules := rs.V4
			if f == a.v6 {
				rules = rs.V6
			}
			for i := len(rules) - 1; i >= 0; i-- {
				r := rules[i]
				if isBuiltin(r.Chain) && !strings.HasPrefix(r.Target(), ChainPrefix) {
					a.execs.Add(1)
					if err := f.ipt.DeleteIfExists(r.Table, r.Chain, r.Params...); err != nil && !notExist(err) {
						errs = append(errs, classify(err))
					}
				}
			}
		}
		out, err := a.run(f.save, "", nil)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		st := ParseSave(out)
		for table := range st {
			for _, j := range st.JumpsToOwn(table) {
				a.execs.Add(1)
				if err := f.ipt.DeleteIfExists(table, j.Chain, j.Params...); err != nil && !notExist(err) {
					errs = append(errs, classify(err))
				}
			}
			errs = append(errs, a.dropChains(f, table, st.OwnChains(table)))
		}
	}
	return errors.Join(errs...)
}

// dropChains flushes all the chains first (they may jump to each other),
// then deletes them; chains that do not exist are skipped.
func (a *Applier) dropChains(f *family, table string, chains []string) error {
	a.execs.Add(1)
	existing, err := f.ipt.ListChains(table)
	if err != nil {
		return classify(err)
	}
	var present []string
	for _, c := range chains {
		if slices.Contains(existing, c) && !isBuiltin(c) {
			present = append(present, c)
		}
	}
	var errs []error
	for _, c := range present {
		a.execs.Add(1)
		if err := f.ipt.ClearChain(table, c); err != nil {
			errs = append(errs, classify(err))
		}
	}
	for _, c := range present {
		a.execs.Add(1)
		if err := f.ipt.DeleteChain(table, c); err != nil {
			errs = append(errs, classify(err))
		}
	}
	return errors.Join(errs...)
}

func notExist(err error) bool {
	var e *iptables.Error
	return errors.As(err, &e) && e.IsNotExist()
}
