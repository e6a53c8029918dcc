package main

import (
	"strings"

	"github.com/spf13/pflag"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/services/capture"
)

// captureSettings are istio-iptables' flags bound to a capture.RulesConfig: every
// flag but --envoy-port also reads UPPER(name, '-'→'_') from the
// environment (Istio's pkg/flag.BindEnv), some with Istio's aliases; the
// command line wins. `istio-iptables`, `clean-iptables` and the capture
// service of `proxy` all read them through here.
type captureSettings struct {
	s   *settings
	cfg capture.RulesConfig
	// proxyUID and proxyGID stay nil when not given: their defaults are
	// computed (the uid of $ENVOY_USER; the uid list).
	proxyUID, proxyGID *string
	probePort          int
}

func bindCaptureSettings(fs *pflag.FlagSet) *captureSettings {
	c := &captureSettings{s: newSettings(fs)}
	d, cfg, s := capture.DefaultRules(), &c.cfg, c.s
	str := func(p *string, name, short, def, usage string, env ...string) {
		flagVar(s, p, def, config.ParseString, flagSpec{name: name, short: short, env: append([]string{envName(name)}, env...), usage: usage})
	}
	boolean := func(p *bool, name, short, usage string, env ...string) {
		flagVar(s, p, false, config.ParseBool, flagSpec{name: name, short: short, env: append([]string{envName(name)}, env...), usage: usage})
	}
	// --envoy-port has no env binding in Istio (ENVOY_PORT is not read).
	flagVar(s, &cfg.ProxyPort, d.ProxyPort, config.ParseString, flagSpec{name: "envoy-port", short: "p", usage: "Envoy port to which all outbound TCP traffic is redirected"})
	str(&cfg.InboundCapturePort, "inbound-capture-port", "z", d.InboundCapturePort, "Port to which all inbound TCP traffic is redirected")
	str(&cfg.InboundTunnelPort, "inbound-tunnel-port", "e", d.InboundTunnelPort, "Envoy's HBONE tunnel port (never captured)")
	optionalFlagVar(s, &c.proxyUID, config.ParseString, flagSpec{name: "proxy-uid", short: "u", env: []string{"PROXY_UID"},
		usage: "UID(s) of the proxy, comma separated: their traffic is not captured (default: uid of $ENVOY_USER, else " + d.ProxyUID + ")"})
	optionalFlagVar(s, &c.proxyGID, config.ParseString, flagSpec{name: "proxy-gid", short: "g", env: []string{"PROXY_GID"},
		usage: "GID(s) of the proxy, comma separated (default: same as --proxy-uid)"})
	str(&cfg.InboundInterceptionMode, "istio-inbound-interception-mode", "m", "", "Inbound interception mode: REDIRECT or TPROXY")
	str(&cfg.InboundTProxyMark, "istio-inbound-tproxy-mark", "t", d.InboundTProxyMark, "Packet mark used by TPROXY mode")
	str(&cfg.InboundTProxyRouteTable, "istio-inbound-tproxy-route-table", "r", d.InboundTProxyRouteTable, "Routing table used by TPROXY mode")
	str(&cfg.InboundPortsInclude, "istio-inbound-ports", "b", "", `Inbound ports to capture, comma separated; "*" for all; empty for none`)
	str(&cfg.InboundPortsExclude, "istio-local-exclude-ports", "d", "", `Inbound ports not to capture (with -b "*")`)
	str(&cfg.ExcludeInterfaces, "istio-exclude-interfaces", "c", "", "Interfaces whose traffic is never captured")
	str(&cfg.OutboundIPRangesInclude, "istio-service-cidr", "i", "", `Outbound CIDRs to capture; "*" for all; empty for none`)
	str(&cfg.OutboundIPRangesExclude, "istio-service-exclude-cidr", "x", "", "Outbound CIDRs never captured")
	str(&cfg.OutboundPortsInclude, "istio-outbound-ports", "q", "", "Outbound ports always captured")
	str(&cfg.OutboundPortsExclude, "istio-local-outbound-ports-exclude", "o", "", "Outbound ports never captured")
	str(&cfg.RerouteVirtualInterfaces, "kube-virt-interfaces", "k", "", "Virtual interfaces whose inbound traffic is treated as outbound")
	boolean(&cfg.DryRun, "dry-run", "n", "Print the rules; change nothing")
	flagVar(s, &c.probePort, int(d.IptablesProbePort), config.ParsePort, flagSpec{name: "iptables-probe-port", env: []string{"IPTABLES_PROBE_PORT"}, usage: "Port the validation probe dials"})
	flagVar(s, &cfg.ProbeTimeout, d.ProbeTimeout, config.ParseDuration, flagSpec{name: "probe-timeout", env: []string{"PROBE_TIMEOUT"}, usage: "Validation probe timeout"})
	boolean(&cfg.SkipRuleApply, "skip-rule-apply", "", "Do not program rules (validate only)")
	boolean(&cfg.RunValidation, "run-validation", "", "Check with a probe connection that capture works")
	boolean(&cfg.RedirectDNS, "redirect-dns", "", "Redirect DNS to the agent's DNS proxy (15053)", "ISTIO_META_DNS_CAPTURE")
	boolean(&cfg.DropInvalid, "drop-invalid", "", "Drop packets conntrack marks INVALID", "INVALID_DROP")
	boolean(&cfg.DualStack, "dual-stack", "", "Dual-stack host", "ISTIO_DUAL_STACK")
	boolean(&cfg.CaptureAllDNS, "capture-all-dns", "", "Capture DNS to any server, not only resolv.conf's")
	str(&cfg.NetworkNamespace, "network-namespace", "", "", "Network namespace file to program from outside it, as the CNI plugin does (/proc/PID/ns/net, /var/run/netns/NAME); locked per namespace")
	boolean(&cfg.CNIMode, "cni-mode", "", "Running inside the CNI plugin")
	boolean(&cfg.Reconcile, "reconcile", "", "Replace drifted rules")
	boolean(&cfg.CleanupOnly, "cleanup-only", "", "Only remove the rules")
	boolean(&cfg.ForceApply, "force-apply", "", "Apply even if the rules are already in place")
	boolean(&cfg.NativeNftables, "native-nftables", "", "Use native nftables (tables inet istio-proxy-nat, -mangle, -raw; needs the nft binary) instead of iptables rules")
	str(&cfg.ForceIptablesBinary, "force-iptables-binary", "", "", `Force the iptables binary: "legacy" or "nft"`)
	return c
}

// config resolves the environment and what flags cannot express: the
// --proxy-uid default (the uid of $ENVOY_USER, default istio-proxy, else
// 1337), the GID default (the UIDs), and the environment-only settings
// ISTIO_OUTBOUND_OWNER_GROUPS[_EXCLUDE] and ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR.
// Every bad value, of a flag or a variable, is in the error.
func (c *captureSettings) config(host hostInputs) (capture.RulesConfig, error) {
	r := envReader{env: host.env, problems: c.s.problems}
	_ = c.s.resolve(host.env)
	cfg := c.cfg
	cfg.IptablesProbePort = uint16(c.probePort)
	cfg.ProxyUID = capture.DefaultRules().ProxyUID
	if c.proxyUID != nil {
		cfg.ProxyUID = *c.proxyUID
	} else if host.lookupUID != nil {
		if uid, err := host.lookupUID(envVar(r, "ENVOY_USER", "istio-proxy", config.ParseString)); err == nil {
			cfg.ProxyUID = uid
		}
	}
	cfg.ProxyGID = cfg.ProxyUID
	if c.proxyGID != nil && *c.proxyGID != "" {
		cfg.ProxyGID = *c.proxyGID
	}
	cfg.OwnerGroupsInclude = envVar(r, "ISTIO_OUTBOUND_OWNER_GROUPS", capture.DefaultRules().OwnerGroupsInclude, config.ParseString)
	cfg.OwnerGroupsExclude = envVar(r, "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "", config.ParseString)
	cfg.HostIPv4LoopbackCidr = envVar(r, "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", capture.DefaultRules().HostIPv4LoopbackCidr, config.ParseString)
	return cfg, c.s.problems.err()
}

// envName is Istio's env binding of an istio-iptables flag.
func envName(flag string) string { return strings.ToUpper(strings.ReplaceAll(flag, "-", "_")) }
