package capture

import (
	"context"
	"fmt"

	"github.com/thejerf/suture/v4"

	"github.com/meshagent/meshagent/messages"
)

// useNft decides the backend as istio-iptables does (Residue.Choose): a
// flag, else what the node holds, so that a sidecar checks what its init
// container or the CNI plugin programmed whichever backend that was, and a
// VM keeps the backend its node already uses. A probe that cannot read the
// rules (a sidecar without CAP_NET_ADMIN) leaves the iptables check, which
// reports it as not verified.
func (s *Service) useNft(ctx context.Context) (bool, error) {
	c := s.cfg.Rules
	if c.NativeNftables || c.ForceIptablesBinary != "" {
		return c.NativeNftables, nil
	}
	r, err := ProbeResidue(ctx, s.log)
	if err != nil {
		return false, nil
	}
	backend, why, err := r.Choose(false, false)
	if err != nil {
		return false, err
	}
	s.log.Info("capture backend", "backend", string(backend), "why", why)
	return backend == BackendNftables, nil
}

// serveNftOr is serveNft, or the verdict on a node whose backend could not
// be chosen (rules of both kinds): Degraded in a sidecar, an error in VM.
func (s *Service) serveNftOr(ctx context.Context, chooseErr error) error {
	if chooseErr == nil {
		return s.serveNft(ctx)
	}
	if s.cfg.Mode == Sidecar {
		s.report(messages.Degraded, chooseErr.Error())
		return suture.ErrDoNotRestart
	}
	return fmt.Errorf("capture: %w", chooseErr)
}

// serveNft is Serve for a capture programmed with native nftables
// (NATIVE_NFTABLES, #23). Sidecar: check our tables are there and report.
// VM: apply, re-check every CheckInterval and rebuild what drifted (one
// transaction), remove our tables when cancelled.
func (s *Service) serveNft(ctx context.Context) error {
	s.report(messages.Starting, "checking nftables capture rules")
	rs := BuildNft(s.cfg.Rules)
	a, err := NewNftApplier(s.log)
	if err != nil {
		return s.noApplier(err)
	}
	if s.cfg.Mode == Sidecar {
		// The reason names the backend for /debug/tree.
		missing, err := a.Missing(ctx, rs)
		s.verdict(missing, err, "nftables capture in place")
		return suture.ErrDoNotRestart
	}
	cfg := s.cfg.Rules
	cfg.CleanupOnly, cfg.DryRun = false, false
	defer func() {
		cleanup := cfg
		cleanup.CleanupOnly = true
		// ctx is done here: the removal must still run.
		if _, err := ExecuteNft(context.WithoutCancel(ctx), cleanup, rs, a, s.log); err != nil {
			s.log.Error("removing capture tables", "error", err)
		} else {
			s.log.Info("capture tables removed")
		}
	}()
	for {
		// Rebuild only what drifted: an apply replaces our tables, which
		// resets their counters and costs a kernel RCU wait.
		missing, err := a.Missing(ctx, rs)
		if err != nil {
			return s.stopped(ctx, err)
		}
		if len(missing) > 0 {
			outcome, err := ExecuteNft(ctx, cfg, rs, a, s.log)
			if err != nil {
				return s.stopped(ctx, err)
			}
			s.log.Info("capture rules programmed", "outcome", string(outcome), "backend", a.Backend(), "missing", summarize(missing))
		}
		s.report(messages.Ready, "nftables capture in place")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.clock.After(s.cfg.CheckInterval):
		}
	}
}

// stopped is the error of a step that failed: the cancellation itself when
// it was cut short by a stop (an nft process killed by ctx), else err.
func (s *Service) stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("capture: %w", err)
}
