package capture

import (
	"slices"
	"strings"
)

// builtinChains are the kernel's chains: never created, flushed or deleted.
var builtinChains = []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}

func isBuiltin(chain string) bool { return slices.Contains(builtinChains, chain) }

// RestoreInput renders rules as iptables-restore --noflush input, exactly as
// istio-iptables does: one "* table" block per table that has rules, tables
// sorted by name, each block "-N" for every own chain (chains with rules in
// order of first use, then chains only jumped to), the rules in build order,
// then COMMIT. No rules gives "".
func RestoreInput(rules []Rule) string {
	var sb strings.Builder
	for _, table := range Tables(rules) {
		sb.WriteString("* " + table + "\n")
		for _, chain := range ownChains(rules, table) {
			sb.WriteString("-N " + chain + "\n")
		}
		for _, r := range rules {
			if r.Table == table {
				sb.WriteString(r.Spec() + "\n")
			}
		}
		sb.WriteString("COMMIT\n")
	}
	return sb.String()
}

// ownChains lists the non-built-in chains of one table that the rules use:
// first those with rules (first-use order), then jump targets without rules.
func ownChains(rules []Rule, table string) []string {
	var chains []string
	for _, r := range rules {
		if r.Table == table && !isBuiltin(r.Chain) && !slices.Contains(chains, r.Chain) {
			chains = append(chains, r.Chain)
		}
	}
	for _, r := range rules {
		if t := r.Target(); r.Table == table && strings.HasPrefix(t, ChainPrefix) && !slices.Contains(chains, t) {
			chains = append(chains, t)
		}
	}
	return chains
}

// Tables lists the tables the rules touch, sorted.
func Tables(rules []Rule) []string {
	var tables []string
	for _, r := range rules {
		if !slices.Contains(tables, r.Table) {
			tables = append(tables, r.Table)
		}
	}
	slices.Sort(tables)
	return tables
}

// DryRunText is what istio-iptables --dry-run records (its golden files):
// the state reads, the IPv4 restore input, the IPv6 one when enabled, and the
// final state dumps.
func (rs RuleSet) DryRunText() string {
	var sb strings.Builder
	sb.WriteString("iptables-save\nip6tables-save\n")
	sb.WriteString(RestoreInput(rs.V4))
	if rs.IPv6 {
		sb.WriteString(RestoreInput(rs.V6))
	}
	sb.WriteString("iptables-save\n")
	if rs.IPv6 {
		sb.WriteString("ip6tables-save\n")
	}
	return sb.String()
}
