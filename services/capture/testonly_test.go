package capture

import "context"

// Methods only the tests use (issue 34: no production code kept for
// tests): the agent applies through apply with the state it read, and
// never counts its execs or compares dumps.

// Execs is the number of processes started so far.
func (a *NftApplier) Execs() int64 { return a.execs.Load() + a.routes.Execs() }

// Apply replaces whatever tables of ours exist with rs in one transaction:
// the tables of ours present are deleted and the ones rs needs are built
// again. Deleting first, rather than Istio's flush alone, also drops chains
// an earlier configuration declared and this one does not, and a table this
// one no longer needs (a TPROXY mangle table after a switch to REDIRECT): a
// re-run leaves exactly one, current, set of rules.
func (a *NftApplier) Apply(ctx context.Context, rs NftRuleSet) error {
	st, err := a.State(ctx)
	if err != nil {
		return err
	}
	return a.apply(ctx, rs, st)
}

// Normalized is the dump for comparisons: tables with their chains and
// rules, counters and comments dropped, built-in chains without rules left out.
func (st SaveState) Normalized() map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for name, t := range st {
		chains := map[string][]string{}
		for _, c := range t.Chains {
			if isBuiltin(c) && len(t.Rules[c]) == 0 {
				continue
			}
			chains[c] = append([]string{}, t.Rules[c]...)
		}
		if len(chains) > 0 {
			out[name] = chains
		}
	}
	return out
}
