package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/meshagent/meshagent/services/capture"
)

// runNativeNftables is istio-iptables --native-nftables (#23): Istio's
// nftables tables, applied as one nft transaction. --dry-run prints the
// transaction (nft -f input, what Istio's backend logs as "nftables rules
// programmed") and changes nothing; Istio's own nft backend ignores
// --dry-run and applies.
func runNativeNftables(ctx context.Context, cfg capture.RulesConfig, stdout io.Writer, log *slog.Logger) error {
	rules := capture.BuildNft(cfg)
	if cfg.DryRun {
		if cfg.CleanupOnly {
			fmt.Fprint(stdout, capture.NftRemovalText())
		} else {
			fmt.Fprint(stdout, rules.Text())
		}
		return nil
	}
	applier, err := capture.NewNftApplier(log)
	if err != nil {
		return fmt.Errorf("istio-iptables: %w", err)
	}
	outcome, err := capture.ExecuteNft(ctx, cfg, rules, applier, log)
	if err != nil {
		return fmt.Errorf("istio-iptables: %w", err)
	}
	log.Info("done", "outcome", string(outcome), "backend", applier.Backend())
	return runValidation(ctx, cfg, log)
}

// cleanNftables is clean-iptables --native-nftables: our three tables go,
// in one transaction, and nothing else; with --dry-run it prints that
// transaction.
func cleanNftables(ctx context.Context, cfg capture.RulesConfig, stdout io.Writer, log *slog.Logger) error {
	if cfg.DryRun {
		fmt.Fprint(stdout, capture.NftRemovalText())
		return nil
	}
	applier, err := capture.NewNftApplier(log)
	if err != nil {
		return fmt.Errorf("clean-iptables: %w", err)
	}
	cfg.CleanupOnly = true
	if _, err := capture.ExecuteNft(ctx, cfg, capture.NftRuleSet{}, applier, log); err != nil {
		return fmt.Errorf("clean-iptables: %w", err)
	}
	return nil
}
