package main

import (
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/meshagent/meshagent/services/capture"
)

// captureConfig is the capture service's config for `proxy`: the same
// istio-iptables settings, from the same environment variables the init
// container and Istio's VM bundle use (ISTIO_INBOUND_PORTS,
// ISTIO_SERVICE_CIDR, ISTIO_LOCAL_EXCLUDE_PORTS, ...), read through the same
// bindings as `istio-iptables` with no flag given. With --capture
// (MESHAGENT_CAPTURE, VM mode) the agent owns the rules: apply, reconcile,
// remove on stop; otherwise it only verifies them.
func captureConfig(r envReader, f *proxyFlags, host hostInputs, log *slog.Logger) *capture.ServiceConfig {
	settings := bindCaptureSettings(pflag.NewFlagSet("capture", pflag.ContinueOnError))
	cfg, err := settings.config(host)
	if err != nil {
		r.problems.addf("capture settings: %w", err)
		return nil
	}
	if err := fillHostInputs(&cfg, host, log); err != nil {
		r.problems.addf("capture settings: %w", err)
		return nil
	}
	sc := &capture.ServiceConfig{Mode: capture.Sidecar, Capture: cfg, CheckInterval: f.captureInterval}
	if f.capture {
		sc.Mode = capture.VM
	}
	return sc
}
