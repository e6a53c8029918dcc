package config

import (
	"errors"
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
func captureConfig(r envReader, f *ProxyFlags, host Host, log *slog.Logger) *capture.Config {
	settings := BindCaptureSettings(pflag.NewFlagSet("capture", pflag.ContinueOnError))
	// istio-iptables' settings read the environment as Istio's init
	// container does: REDIRECT_DNS and DUAL_STACK fall back to
	// ISTIO_META_DNS_CAPTURE and ISTIO_DUAL_STACK, which the DNS proxy's and
	// Envoy's configs read as well (#26: the one pair of variables with two
	// readers in a start; a bad value is reported once, by the first).
	cfg, err := settings.Config(host)
	if err != nil {
		r.problems.addf("capture settings: %w", err)
		return nil
	}
	if err := FillHostInputs(&cfg, host, log); err != nil {
		r.problems.addf("capture settings: %w", err)
		return nil
	}
	sc := &capture.Config{Mode: capture.Sidecar, Rules: cfg, CheckInterval: f.captureInterval}
	if f.Capture {
		sc.Mode = capture.VM
	}
	return sc
}

// FillHostInputs reads the host's addresses (IPv6 or not) and DNS servers
// into cfg. Istio exits 1 when the host has no usable address; a namespace
// with no address yet (a bare "unshare -n") is a normal place to run, so we
// go on with IPv4 only, loudly.
func FillHostInputs(cfg *capture.RulesConfig, host Host, log *slog.Logger) error {
	in := capture.HostInputs{ResolvConf: host.ResolvConf, InterfaceAddrs: host.InterfaceAddrs}
	err := cfg.FillHostInputs(in)
	if err == nil || !errors.Is(err, capture.ErrNoLocalIP) {
		return err
	}
	log.Warn("no non-loopback, non-link-local address found: programming IPv4 rules only", "error", err)
	return cfg.FillDNSServers(in)
}
