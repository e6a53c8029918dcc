package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/services/capture"
)

// newIstioIptablesCommand is "meshagent istio-iptables": Istio's
// istio-iptables (pilot-agent istio-iptables) with the same flags, env
// bindings, defaults and exit codes (2 for bad input here, 126 for a failed
// --run-validation).
func newIstioIptablesCommand(host config.Host) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "istio-iptables",
		Short: "Program Istio-compatible iptables traffic capture for the sidecar",
		Long: `Program the iptables rules that send a pod's (or VM's) traffic through Envoy,
exactly as Istio's istio-iptables does. Every flag but --envoy-port can also be
set with an env var: the flag name upper-cased with '-' as '_' (--istio-inbound-ports
= ISTIO_INBOUND_PORTS); the command line wins. --dry-run prints the
iptables-restore input for IPv4 and IPv6 and changes nothing. With
--native-nftables (NATIVE_NFTABLES) the rules are Istio's nftables tables
(inet istio-proxy-nat, istio-proxy-mangle, istio-proxy-raw), applied as one nft
transaction; --dry-run prints that transaction (nft -f input).`,
		Args: cobra.NoArgs,
	}
	return withCaptureSettings(cmd, host, func(cmd *cobra.Command, cfg capture.RulesConfig) error {
		return runIstioIptables(cmd.Context(), cfg, host, cmd.OutOrStdout(), cmd.ErrOrStderr())
	})
}

// withCaptureSettings gives cmd istio-iptables' flags and env bindings, and
// has it run run with the capture configuration they make; a bad one is a
// usage error (exit 2).
func withCaptureSettings(cmd *cobra.Command, host config.Host, run func(*cobra.Command, capture.RulesConfig) error) *cobra.Command {
	flags := config.BindCaptureSettings(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := flags.Config(host)
		if err != nil {
			return usageError("%s: %v", cmd.Name(), err)
		}
		if cmd.Flags().Changed("network-namespace") && cfg.NetworkNamespace == "" {
			// Not "no namespace": it would program the caller's own (#33).
			return usageError("%s: --network-namespace is empty: want a network namespace file (/proc/PID/ns/net, /var/run/netns/NAME)", cmd.Name())
		}
		return run(cmd, cfg)
	}
	return cmd
}

func runIstioIptables(ctx context.Context, cfg capture.RulesConfig, host config.Host, stdout, stderr io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return usageError("istio-iptables: %v", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("cmd", "istio-iptables")
	if cfg.NetworkNamespace != "" {
		// The host inputs (addresses) are the pod's: read them inside.
		return inNetworkNamespace(cfg.NetworkNamespace, log, func() error {
			return programCapture(ctx, cfg, host, stdout, log)
		})
	}
	return programCapture(ctx, cfg, host, stdout, log)
}

// programCapture is istio-iptables from the host inputs on, in the network
// namespace the calling thread is in.
func programCapture(ctx context.Context, cfg capture.RulesConfig, host config.Host, stdout io.Writer, log *slog.Logger) error {
	if err := config.FillHostInputs(&cfg, host, log); err != nil {
		return fmt.Errorf("istio-iptables: %w", err)
	}
	if err := cfg.Validate(); err != nil { // DNS servers read from resolv.conf
		return usageError("istio-iptables: %v", err)
	}
	if cfg.RedirectDNS && !cfg.CaptureAllDNS && len(cfg.DNSServersV4)+len(cfg.DNSServersV6) == 0 {
		log.Warn("REDIRECT_DNS is set, but CAPTURE_ALL_DNS is false, and no DNS servers provided. DNS capture disabled.")
	}
	nft := cfg.NativeNftables
	if !cfg.DryRun && !cfg.SkipRuleApply {
		backend, err := chooseBackend(ctx, cfg, stdout, log)
		if err != nil || backend == "" {
			return err
		}
		nft = backend == capture.BackendNftables
	}
	if nft {
		return runNativeNftables(ctx, cfg, stdout, log)
	}
	return runIptablesBackend(ctx, cfg, stdout, log)
}

// chooseBackend decides between iptables and nftables from the flags and
// what the node already holds (capture.Residue.Choose), and logs why. A
// --cleanup-only with neither flag on a node holding both sets is the
// remedy for that state: it cleans both and returns "".
func chooseBackend(ctx context.Context, cfg capture.RulesConfig, stdout io.Writer, log *slog.Logger) (capture.Backend, error) {
	residue, err := capture.ProbeResidue(ctx, log)
	if err != nil {
		return "", fmt.Errorf("istio-iptables: %w", err)
	}
	explicit := cfg.NativeNftables || cfg.ForceIptablesBinary != ""
	if cfg.CleanupOnly && !explicit && residue.Iptables && residue.Nftables {
		log.Info("capture rules of both backends present: cleaning both")
		return "", errors.Join(runNativeNftables(ctx, cfg, stdout, log), runIptablesBackend(ctx, cfg, stdout, log))
	}
	backend, why, err := residue.Choose(cfg.NativeNftables, cfg.ForceIptablesBinary != "")
	if err != nil {
		return "", fmt.Errorf("istio-iptables: %w", err)
	}
	log.Info("capture backend", "backend", string(backend), "why", why)
	return backend, nil
}

// runIptablesBackend is istio-iptables with the iptables backend.
func runIptablesBackend(ctx context.Context, cfg capture.RulesConfig, stdout io.Writer, log *slog.Logger) error {
	rules := capture.Build(cfg)
	if cfg.DryRun {
		printRules(stdout, rules)
		return nil
	}
	applier, err := capture.NewApplier(cfg.ForceIptablesBinary, cfg.EnableIPv6, log)
	if err != nil {
		return fmt.Errorf("istio-iptables: %w", err)
	}
	outcome, err := capture.Execute(cfg, rules, applier, log)
	if err != nil {
		return fmt.Errorf("istio-iptables: %w", err)
	}
	log.Info("done", "outcome", string(outcome), "backend", applier.Backend())
	return runValidation(ctx, cfg, log)
}

// runValidation is --run-validation, for either backend: a probe connection
// must be captured, else exit 126 as Istio's.
func runValidation(ctx context.Context, cfg capture.RulesConfig, log *slog.Logger) error {
	if !cfg.RunValidation || cfg.CleanupOnly {
		return nil
	}
	if err := capture.ValidateCapture(ctx, cfg); err != nil {
		return &exitError{code: 126, err: fmt.Errorf("istio-iptables: %w", err)}
	}
	log.Info("validation passed")
	return nil
}

// printRules prints what would be applied, one restore input per family.
func printRules(w io.Writer, rs capture.RuleSet) {
	fmt.Fprintln(w, "# IPv4: iptables-restore --noflush <<EOF")
	fmt.Fprint(w, capture.RestoreInput(rs.V4))
	fmt.Fprintln(w, "# EOF")
	if rs.IPv6 {
		fmt.Fprintln(w, "# IPv6: ip6tables-restore --noflush <<EOF")
		fmt.Fprint(w, capture.RestoreInput(rs.V6))
		fmt.Fprintln(w, "# EOF")
	} else {
		fmt.Fprintln(w, "# IPv6: not enabled (the host's first global address is IPv4)")
	}
}

// newCleanIptablesCommand is "meshagent clean-iptables" (Istio's former
// istio-clean-iptables): removes every ISTIO_* chain and every jump to one,
// in both families, whatever flags created them, and our nftables tables
// (--native-nftables: only the tables; --force-iptables-binary: only the
// chains). It takes istio-iptables' flags too: rules of ours in built-in
// chains that jump nowhere (TPROXY marks, interface RETURNs) are removed
// when they exactly match what those flags (in either interception mode)
// would create. Nothing else is touched.
func newCleanIptablesCommand(host config.Host) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "clean-iptables",
		Short: "Remove the ISTIO_* iptables chains and the jumps to them (IPv4 and IPv6), and the istio-proxy-* nftables tables",
		Args:  cobra.NoArgs,
	}
	return withCaptureSettings(cmd, host, func(cmd *cobra.Command, cfg capture.RulesConfig) error {
		if err := cfg.Validate(); err != nil {
			return usageError("clean-iptables: %v", err)
		}
		log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)).With("cmd", "clean-iptables")
		if cfg.NetworkNamespace != "" {
			// The pod's rules, not the caller's (#33: the flag was taken
			// and the node's own capture rules removed).
			return inNetworkNamespace(cfg.NetworkNamespace, log, func() error {
				return cleanCapture(cmd.Context(), cfg, cmd.OutOrStdout(), log)
			})
		}
		return cleanCapture(cmd.Context(), cfg, cmd.OutOrStdout(), log)
	})
}

// cleanCapture is clean-iptables in the network namespace the calling
// thread is in.
func cleanCapture(ctx context.Context, cfg capture.RulesConfig, stdout io.Writer, log *slog.Logger) error {
	if cfg.NativeNftables {
		return cleanNftables(ctx, cfg, stdout, log)
	}
	// With neither backend named, our nftables tables go too: clean-iptables
	// is the remedy for a node holding both sets (#23).
	if cfg.ForceIptablesBinary == "" && !cfg.DryRun {
		if r, err := capture.ProbeResidue(ctx, log); err == nil && r.Nftables {
			if err := cleanNftables(ctx, cfg, stdout, log); err != nil {
				return err
			}
			if !r.IptablesUsable {
				return nil
			}
		}
	}
	if err := cleanIptables(cfg, stdout, log); err != nil {
		return fmt.Errorf("clean-iptables: %w", err)
	}
	return nil
}

// cleanIptables removes every ISTIO_* chain and jump, and the rules of
// ours cfg (in either interception mode) puts in built-in chains; with
// DryRun it prints what it would remove.
func cleanIptables(cfg capture.RulesConfig, stdout io.Writer, log *slog.Logger) error {
	var known []capture.RuleSet
	for _, mode := range []string{"REDIRECT", "TPROXY"} {
		c := cfg
		c.InboundInterceptionMode, c.EnableIPv6 = mode, true
		known = append(known, capture.Build(c))
	}
	if cfg.DryRun {
		fmt.Fprintln(stdout, "# dry run: would remove every ISTIO_* chain, the rules jumping to them, and these rules where present:")
		for _, rs := range known {
			for _, r := range append(rs.V4, rs.V6...) {
				if r.Chain == "PREROUTING" || r.Chain == "OUTPUT" {
					fmt.Fprintf(stdout, "-t %s %s\n", r.Table, r.Spec())
				}
			}
		}
		return nil
	}
	applier, err := capture.NewApplier(cfg.ForceIptablesBinary, false, log)
	if err != nil {
		return err
	}
	return applier.CleanState(known...)
}
