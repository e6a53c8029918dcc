package main

import (
	"fmt"
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/meshagent/meshagent/services/capture"
)

// captureConfig is the capture service's config for `proxy`: the same
// istio-iptables settings, read from the same environment variables the
// init container and Istio's VM bundle use (ISTIO_INBOUND_PORTS,
// ISTIO_SERVICE_CIDR, ISTIO_LOCAL_EXCLUDE_PORTS, ...). vm: the agent owns the
// rules (apply, reconcile, remove on stop); otherwise it only verifies them.
func captureConfig(lookup func(string) (string, bool), vm bool, log *slog.Logger) (*capture.ServiceConfig, error) {
	getenv := func(k string) string { v, _ := lookup(k); return v }
	var cfg capture.Config
	fs := pflag.NewFlagSet("capture", pflag.ContinueOnError)
	flags := capture.BindFlags(fs, &cfg, getenv, nil)
	if err := fs.Parse(nil); err != nil {
		return nil, fmt.Errorf("capture settings: %w", err)
	}
	if err := flags.Finish(); err != nil {
		return nil, fmt.Errorf("capture settings: %w", err)
	}
	if err := fillHostInputs(&cfg, capture.HostInputs{}, log); err != nil {
		return nil, fmt.Errorf("capture settings: %w", err)
	}
	sc := &capture.ServiceConfig{Mode: capture.Sidecar, Capture: cfg}
	if vm {
		sc.Mode = capture.VM
	}
	if err := sc.Validate(); err != nil {
		return nil, fmt.Errorf("capture settings: %w", err)
	}
	return sc, nil
}
