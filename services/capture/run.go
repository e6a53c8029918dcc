package capture

import (
	"errors"
	"fmt"
	"log/slog"
)

// Outcome says what Execute did.
type Outcome string

const (
	Applied    Outcome = "applied"     // rules programmed from a clean state
	Unchanged  Outcome = "unchanged"   // rules already in place: nothing done
	Reconciled Outcome = "reconciled"  // drifted rules replaced atomically
	CleanedUp  Outcome = "cleaned up"  // --cleanup-only
	NotApplied Outcome = "not applied" // --skip-rule-apply
)

// Execute is istio-iptables' run: with CleanupOnly remove the rules; else
// verify the current state and apply when there is nothing of ours,
// do nothing when our rules are already exactly there (unless ForceApply),
// replace them when they drifted and Reconcile is set, otherwise try to
// apply anyway (which fails on the existing chains, as Istio's does).
func Execute(cfg RulesConfig, rs RuleSet, a *Applier, log *slog.Logger) (Outcome, error) {
	if cfg.CleanupOnly {
		err := errors.Join(a.Cleanup(rs), a.CleanupRouting(cfg))
		return CleanedUp, err
	}
	if cfg.SkipRuleApply {
		return NotApplied, nil
	}
	residue, delta, err := a.Verify(rs)
	if err != nil {
		return "", fmt.Errorf("read current iptables state: %w", err)
	}
	outcome := Applied
	switch {
	case !residue:
		err = a.Apply(rs, false)
	case !delta && !cfg.ForceApply:
		// Debug, not Info: VM mode re-checks every CheckInterval and would
		// write this line to the journal each time; the one-shot command
		// still says it in its "done outcome=unchanged" line.
		log.Debug("capture rules already in place; nothing to do")
		outcome = Unchanged
	case delta && cfg.Reconcile:
		log.Info("existing capture rules differ; replacing them")
		outcome = Reconciled
		err = a.Reconcile(rs)
	default:
		if delta {
			log.Warn("existing capture rules differ and --reconcile is off; applying anyway")
		}
		err = a.Apply(rs, true)
		if err != nil && delta {
			err = fmt.Errorf("%w: %w", ErrDrift, err)
		}
	}
	if err != nil {
		return "", err
	}
	if err := a.SetupRouting(cfg); err != nil {
		return "", err
	}
	return outcome, nil
}
