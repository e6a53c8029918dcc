package capture

import (
	"strings"
)

// TableState is one table of an iptables-save dump.
type TableState struct {
	Chains []string            // every chain declared (":NAME POLICY [p:b]"), in order
	Rules  map[string][]string // chain -> rule specs after "-A CHAIN ", in order
}

// SaveState is a parsed iptables-save dump: table name -> state.
type SaveState map[string]*TableState

// ParseSave parses iptables-save output.
func ParseSave(out string) SaveState {
	st := SaveState{}
	var cur *TableState
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || line == "COMMIT":
		case strings.HasPrefix(line, "*"):
			cur = &TableState{Rules: map[string][]string{}}
			st[strings.TrimSpace(line[1:])] = cur
		case cur == nil:
		case strings.HasPrefix(line, ":"):
			if f := strings.Fields(line[1:]); len(f) > 0 {
				cur.Chains = append(cur.Chains, f[0])
			}
		case strings.HasPrefix(line, "-A "):
			rest := line[3:]
			chain, spec, _ := strings.Cut(rest, " ")
			cur.Rules[chain] = append(cur.Rules[chain], spec)
		}
	}
	return st
}

// Residue reports whether any of our chains, or any rule naming one, exists.
func (st SaveState) Residue() bool {
	for _, t := range st {
		for _, c := range t.Chains {
			if strings.HasPrefix(c, ChainPrefix) {
				return true
			}
		}
		for chain, rules := range t.Rules {
			if strings.HasPrefix(chain, ChainPrefix) {
				return true
			}
			for _, r := range rules {
				if strings.Contains(r, ChainPrefix) {
					return true
				}
			}
		}
	}
	return false
}

// OwnChains lists the ISTIO_* chains present in a table.
func (st SaveState) OwnChains(table string) []string {
	return st.chains(table, true)
}

// JumpsToOwn lists, per built-in (or other foreign) chain, the rule specs
// that jump to one of our chains.
func (st SaveState) JumpsToOwn(table string) []Rule {
	var out []Rule
	for _, chain := range st.chains(table, false) {
		for _, spec := range st[table].Rules[chain] {
			r := Rule{Table: table, Chain: chain, Params: splitArgs(spec)}
			if strings.HasPrefix(r.Target(), ChainPrefix) {
				out = append(out, r)
			}
		}
	}
	return out
}

// chains lists a table's chains that are ours (own: ISTIO_*) or that are
// not; none for a table the dump does not have.
func (st SaveState) chains(table string, own bool) []string {
	t := st[table]
	if t == nil {
		return nil
	}
	var out []string
	for _, c := range t.Chains {
		if strings.HasPrefix(c, ChainPrefix) == own {
			out = append(out, c)
		}
	}
	return out
}

// splitArgs splits a rule spec as a shell would for iptables-save output
// (double-quoted words such as comments stay one argument).
func splitArgs(s string) []string {
	var args []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '\\' && inQuote && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case ch == '"':
			inQuote, have = !inQuote, true
		case ch == ' ' && !inQuote:
			if have {
				args = append(args, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(ch)
			have = true
		}
	}
	if have {
		args = append(args, cur.String())
	}
	return args
}
