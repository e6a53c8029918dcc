package capture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/thejerf/suture/v4"

	"github.com/meshagent/meshagent/messages"
)

// Mode is who owns the rules.
type Mode int

const (
	// Sidecar: an init container (or the CNI) programmed the rules; the
	// service only checks they are there, reports, and stops.
	Sidecar Mode = iota
	// VM: the agent owns the rules: applies them at start, re-applies them
	// if they are flushed, removes them when stopped.
	VM
)

// Config configures the capture service, the face every service has (#26):
// Config, Inputs, Outputs, New(cfg, in, out, rt).
type Config struct {
	Mode Mode
	// Rules is what the rules are built from: istio-iptables' config (host
	// inputs already filled: EnableIPv6, DNS servers).
	Rules RulesConfig
	// CheckInterval is how often VM mode re-checks the rules
	// (MESHAGENT_CAPTURE_CHECK_INTERVAL); required in VM mode.
	CheckInterval time.Duration `env:"MESHAGENT_CAPTURE_CHECK_INTERVAL"`
}

// Validate checks the config, naming the field and value.
func (c Config) Validate() error {
	if c.Mode != Sidecar && c.Mode != VM {
		return fmt.Errorf("%w: capture Mode %d: must be Sidecar or VM", ErrInvalidConfig, c.Mode)
	}
	if c.CheckInterval < 0 || c.Mode == VM && c.CheckInterval == 0 {
		return fmt.Errorf("%w: capture CheckInterval (MESHAGENT_CAPTURE_CHECK_INTERVAL) %s: must be positive", ErrInvalidConfig, c.CheckInterval)
	}
	return c.Rules.Validate()
}

// Name is the service's name in logs, metrics, Health and /debug/tree.
const Name = "capture"

// Service checks (Sidecar) or owns (VM) the traffic capture rules.
type Service struct {
	cfg    Config
	health *messages.Reporter
	clock  messages.Clock
	log    *slog.Logger
}

// Inputs: the capture service reads no channel.
type Inputs struct{}

// Outputs: the capture service publishes on no channel (its verdict is its
// Health).
type Outputs struct{}

// New returns the capture service, or why cfg cannot work (the only check
// of cfg).
func New(cfg Config, _ Inputs, _ Outputs, rt messages.Runtime) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, health: rt.Health, clock: rt.Clock, log: rt.Log}, nil
}

// String is the service's name in logs and the tree.
func (s *Service) String() string { return Name }

// Serve runs the service. Sidecar: report Ready or Degraded (naming what is
// missing) and return suture.ErrDoNotRestart. VM: apply, re-check every
// CheckInterval and re-apply drifted or flushed rules; on cancel remove the
// rules and return ctx.Err().
func (s *Service) Serve(ctx context.Context) error {
	if s.cfg.Mode == Sidecar && !mayReadFirewall() {
		// Istio's sidecar runs without CAP_NET_ADMIN (istio-init had it):
		// every iptables-save and nft it would exec can only be refused.
		// In a start storm those execs took 0.3-3 s of a starved pod's
		// CPU, and readiness waits for this verdict (#36).
		s.notVerified(fmt.Errorf("%w: the agent's effective capabilities lack it, so nothing was run", ErrPermission))
		return suture.ErrDoNotRestart
	}
	if nft, err := s.useNft(ctx); err != nil || nft {
		return s.serveNftOr(ctx, err)
	}
	s.report(messages.Starting, "checking iptables capture rules")
	rs := Build(s.cfg.Rules)
	a, err := NewApplier(s.cfg.Rules.ForceIptablesBinary, s.cfg.Rules.EnableIPv6, s.log)
	if err != nil {
		return s.noApplier(err)
	}
	if s.cfg.Mode == Sidecar {
		s.checkOnce(a, rs)
		return suture.ErrDoNotRestart
	}
	return s.own(ctx, a, rs)
}

// checkOnce gives the sidecar's verdict in two steps. The chains and their
// rule counts come from one iptables-save per family; the exact rules need
// one `iptables -C` each (about 20 execs, 300 ms in a pod, measured against
// istiod: the last condition readiness waited for). The check is
// informational in a sidecar (the init container owns the rules), so it
// must not delay start-up: the verdict on the chains is reported first and
// the rules then refine it.
func (s *Service) checkOnce(a *Applier, rs RuleSet) {
	missing, err := a.MissingChains(rs)
	if err == nil && len(missing) == 0 {
		s.report(messages.Ready, "")
		missing, err = a.MissingRules(rs)
	}
	s.verdict(missing, err, "")
}

// verdict reports a sidecar's check of its rules: not verified when they
// could not be read, Degraded naming what is missing, else Ready with
// reason. Both backends give it.
func (s *Service) verdict(missing []string, err error, reason string) {
	switch {
	case err != nil:
		s.notVerified(err)
	case len(missing) > 0:
		s.report(messages.Degraded, incomplete+summarize(missing))
	default:
		s.report(messages.Ready, reason)
	}
}

// incomplete starts a sidecar's Degraded reason with why it matters and
// who installs the rules, so that the tree explains itself: a newcomer's
// first `meshagent standalone` shows capture degraded, with no istio-init
// having run (#32). The tree's text view keeps both ends of a long reason.
const incomplete = "traffic capture incomplete, so traffic may bypass Envoy " +
	"(istio-init, the CNI or `pilot-agent istio-iptables` installs the rules; `meshagent standalone` never does): missing "

// noApplier is Serve's end when neither backend's applier could be made:
// in a sidecar a verdict (the rules are not verified), in a VM an error.
func (s *Service) noApplier(err error) error {
	if s.cfg.Mode == Sidecar {
		s.notVerified(err)
		return suture.ErrDoNotRestart
	}
	return fmt.Errorf("capture: %w", err)
}

// notVerified reports a sidecar whose rules could not be read. A sidecar
// normally runs without CAP_NET_ADMIN (the init container had it), so "no
// permission" or "no iptables" is expected and must not fail readiness: it
// is Ready with the reason saying nothing was verified. Other errors are
// Degraded.
func (s *Service) notVerified(err error) {
	if errors.Is(err, ErrPermission) || errors.Is(err, ErrNoIptables) || errors.Is(err, ErrNoNft) {
		s.log.Warn("capture rules not verified", "error", err)
		s.report(messages.Ready, "capture rules not verified: "+err.Error())
		return
	}
	s.report(messages.Degraded, "cannot read iptables state: "+err.Error())
}

func (s *Service) own(ctx context.Context, a *Applier, rs RuleSet) error {
	cfg := s.cfg.Rules
	cfg.Reconcile, cfg.CleanupOnly, cfg.ForceApply, cfg.DryRun = true, false, false, false
	defer func() {
		cleanup := cfg
		cleanup.CleanupOnly = true
		if _, err := Execute(cleanup, rs, a, s.log); err != nil {
			s.log.Error("removing capture rules", "error", err)
		} else {
			s.log.Info("capture rules removed")
		}
	}()
	for {
		outcome, err := Execute(cfg, rs, a, s.log)
		if err != nil {
			return fmt.Errorf("capture: %w", err)
		}
		if outcome != Unchanged {
			s.log.Info("capture rules programmed", "outcome", string(outcome), "backend", a.Backend())
		}
		s.report(messages.Ready, "")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.clock.After(s.cfg.CheckInterval):
		}
	}
}

func (s *Service) report(state messages.HealthState, reason string) {
	s.health.Report(state, reason)
}

func summarize(missing []string) string {
	const max = 5
	if len(missing) <= max {
		return strings.Join(missing, "; ")
	}
	return strings.Join(missing[:max], "; ") + fmt.Sprintf("; and %d more", len(missing)-max)
}

// Missing lists, readably, what of rs is absent: chains missing or with a
// different rule count, rules not found (iptables -C). Empty means in place.
func (a *Applier) Missing(rs RuleSet) ([]string, error) {
	missing, err := a.MissingChains(rs)
	if err != nil || len(missing) > 0 {
		return missing, err
	}
	return a.MissingRules(rs)
}

// MissingChains lists our chains that are absent or hold a different number
// of rules than rs: one iptables-save per family.
func (a *Applier) MissingChains(rs RuleSet) ([]string, error) {
	var missing []string
	for _, fr := range a.families(rs) {
		out, err := a.run(fr.f.save, "", nil)
		if err != nil {
			return nil, err
		}
		st := ParseSave(out)
		counts := map[[2]string]int{}
		for _, r := range fr.rules {
			counts[[2]string{r.Table, r.Chain}]++
		}
		for _, table := range Tables(fr.rules) {
			for _, chain := range ownChains(fr.rules, table) {
				t := st[table]
				switch {
				case t == nil || !slices.Contains(t.Chains, chain):
					missing = append(missing, fmt.Sprintf("%s chain %s/%s", fr.f, table, chain))
				case len(t.Rules[chain]) != counts[[2]string{table, chain}]:
					missing = append(missing, fmt.Sprintf("%s chain %s/%s has %d rules, want %d",
						fr.f, table, chain, len(t.Rules[chain]), counts[[2]string{table, chain}]))
				}
			}
		}
	}
	return missing, nil
}

// MissingRules lists the rules of rs that `iptables -C` does not find: one
// exec per rule, exact where the save output's normal form is not ours.
func (a *Applier) MissingRules(rs RuleSet) ([]string, error) {
	var missing []string
	for _, fr := range a.families(rs) {
		for _, r := range fr.rules {
			a.execs.Add(1)
			ok, err := fr.f.ipt.Exists(r.Table, r.Chain, r.Params...)
			if err != nil && !notExist(err) {
				return nil, classify(err)
			}
			if !ok {
				missing = append(missing, fmt.Sprintf("%s rule -t %s -A %s %s", fr.f, r.Table, r.Chain, strings.Join(r.Params, " ")))
			}
		}
	}
	return missing, nil
}
