package config

import (
	"strconv"

	"github.com/spf13/pflag"

	"github.com/meshagent/meshagent/services/capture"
)

// CaptureSettings are istio-iptables' flags bound to a capture.RulesConfig: every
// flag but --envoy-port also reads its variable, UPPER(name, '-'→'_') as
// Istio's pkg/flag.BindEnv names it, some with Istio's aliases; the
// command line wins. `istio-iptables`, `clean-iptables` and the capture
// service of `proxy` all read them through here.
type CaptureSettings struct {
	s   *Settings
	cfg capture.RulesConfig
	// proxyUID and proxyGID stay nil when not given: their defaults are
	// computed (the uid of $ENVOY_USER; the uid list).
	proxyUID, proxyGID *string
	probePort          int
}

func BindCaptureSettings(fs *pflag.FlagSet) *CaptureSettings {
	c := &CaptureSettings{s: NewSettings(fs)}
	cfg, s := &c.cfg, c.s
	str := func(p *string, name, short, usage string, env ...*envVar[string]) {
		envFlagVar(s, p, flagSpec{name: name, short: short, usage: usage}, env...)
	}
	boolean := func(p *bool, name, short, usage string, env ...*envVar[bool]) {
		envFlagVar(s, p, flagSpec{name: name, short: short, usage: usage}, env...)
	}
	// --envoy-port has no env binding in Istio (ENVOY_PORT is not read).
	flagVar(s, &cfg.ProxyPort, istioIptablesEnvoyPort, parseString, flagSpec{name: "envoy-port", short: "p", usage: "Envoy port to which all outbound TCP traffic is redirected"})
	str(&cfg.InboundCapturePort, "inbound-capture-port", "z", "Port to which all inbound TCP traffic is redirected", envInboundCapturePort)
	str(&cfg.InboundTunnelPort, "inbound-tunnel-port", "e", "Envoy's HBONE tunnel port (never captured)", envInboundTunnelPort)
	optionalFlagVar(s, &c.proxyUID, parseString, flagSpec{name: "proxy-uid", short: "u",
		usage: "UID(s) of the proxy, comma separated: their traffic is not captured (default: uid of $ENVOY_USER, else " + strconv.Itoa(proxyUID) + ")"}, envProxyUID)
	optionalFlagVar(s, &c.proxyGID, parseString, flagSpec{name: "proxy-gid", short: "g",
		usage: "GID(s) of the proxy, comma separated (default: same as --proxy-uid)"}, envProxyGID)
	str(&cfg.InboundInterceptionMode, "istio-inbound-interception-mode", "m", "Inbound interception mode: REDIRECT or TPROXY", envIstioInboundInterceptionMode)
	str(&cfg.InboundTProxyMark, "istio-inbound-tproxy-mark", "t", "Packet mark used by TPROXY mode", envIstioInboundTProxyMark)
	str(&cfg.InboundTProxyRouteTable, "istio-inbound-tproxy-route-table", "r", "Routing table used by TPROXY mode", envIstioInboundTProxyRouteTable)
	str(&cfg.InboundPortsInclude, "istio-inbound-ports", "b", `Inbound ports to capture, comma separated; "*" for all; empty for none`, envIstioInboundPorts)
	str(&cfg.InboundPortsExclude, "istio-local-exclude-ports", "d", `Inbound ports not to capture (with -b "*")`, envIstioLocalExcludePorts)
	str(&cfg.ExcludeInterfaces, "istio-exclude-interfaces", "c", "Interfaces whose traffic is never captured", envIstioExcludeInterfaces)
	str(&cfg.OutboundIPRangesInclude, "istio-service-cidr", "i", `Outbound CIDRs to capture; "*" for all; empty for none`, envIstioServiceCIDR)
	str(&cfg.OutboundIPRangesExclude, "istio-service-exclude-cidr", "x", "Outbound CIDRs never captured", envIstioServiceExcludeCIDR)
	str(&cfg.OutboundPortsInclude, "istio-outbound-ports", "q", "Outbound ports always captured", envIstioOutboundPorts)
	str(&cfg.OutboundPortsExclude, "istio-local-outbound-ports-exclude", "o", "Outbound ports never captured", envIstioLocalOutboundPortsExclude)
	str(&cfg.RerouteVirtualInterfaces, "kube-virt-interfaces", "k", "Virtual interfaces whose inbound traffic is treated as outbound", envKubeVirtInterfaces)
	boolean(&cfg.DryRun, "dry-run", "n", "Print the rules; change nothing", envDryRun)
	envFlagVar(s, &c.probePort, flagSpec{name: "iptables-probe-port", usage: "Port the validation probe dials"}, envIptablesProbePort)
	envFlagVar(s, &cfg.ProbeTimeout, flagSpec{name: "probe-timeout", usage: "Validation probe timeout"}, envProbeTimeout)
	boolean(&cfg.SkipRuleApply, "skip-rule-apply", "", "Do not program rules (validate only)", envSkipRuleApply)
	boolean(&cfg.RunValidation, "run-validation", "", "Check with a probe connection that capture works", envRunValidation)
	boolean(&cfg.RedirectDNS, "redirect-dns", "", "Redirect DNS to the agent's DNS proxy (15053)", envRedirectDNS, envIstioMetaDNSCapture)
	boolean(&cfg.DropInvalid, "drop-invalid", "", "Drop packets conntrack marks INVALID", envDropInvalid, envInvalidDrop)
	boolean(&cfg.DualStack, "dual-stack", "", "Dual-stack host", envDualStack, envIstioDualStack)
	boolean(&cfg.CaptureAllDNS, "capture-all-dns", "", "Capture DNS to any server, not only resolv.conf's", envCaptureAllDNS)
	str(&cfg.NetworkNamespace, "network-namespace", "", "Network namespace file to program from outside it, as the CNI plugin does (/proc/PID/ns/net, /var/run/netns/NAME); locked per namespace", envNetworkNamespace)
	boolean(&cfg.CNIMode, "cni-mode", "", "Running inside the CNI plugin", envCNIMode)
	boolean(&cfg.Reconcile, "reconcile", "", "Replace drifted rules", envReconcile)
	boolean(&cfg.CleanupOnly, "cleanup-only", "", "Only remove the rules", envCleanupOnly)
	boolean(&cfg.ForceApply, "force-apply", "", "Apply even if the rules are already in place", envForceApply)
	boolean(&cfg.NativeNftables, "native-nftables", "", "Use native nftables (tables inet istio-proxy-nat, -mangle, -raw; needs the nft binary) instead of iptables rules", envNativeNftables)
	str(&cfg.ForceIptablesBinary, "force-iptables-binary", "", `Force the iptables binary: "legacy" or "nft"`, envForceIptablesBinary)
	return c
}

// config resolves the environment and what flags cannot express: the
// --proxy-uid default (the uid of $ENVOY_USER, default istio-proxy, else
// 1337), the GID default (the UIDs), and the environment-only settings
// ISTIO_OUTBOUND_OWNER_GROUPS[_EXCLUDE] and ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR.
// Every bad value, of a flag or a variable, is in the error.
func (c *CaptureSettings) Config(host Host) (capture.RulesConfig, error) {
	r := envReader{env: host.Env, problems: c.s.Problems}
	_ = c.s.Resolve(host.Env)
	cfg := c.cfg
	cfg.IptablesProbePort = uint16(c.probePort)
	cfg.ProxyUID = strconv.Itoa(proxyUID)
	if c.proxyUID != nil {
		cfg.ProxyUID = *c.proxyUID
	} else if host.LookupUID != nil {
		if uid, err := host.LookupUID(get(r, envEnvoyUser)); err == nil {
			cfg.ProxyUID = uid
		}
	}
	cfg.ProxyGID = cfg.ProxyUID
	if c.proxyGID != nil && *c.proxyGID != "" {
		cfg.ProxyGID = *c.proxyGID
	}
	cfg.OwnerGroupsInclude = get(r, envIstioOutboundOwnerGroups)
	cfg.OwnerGroupsExclude = get(r, envIstioOutboundOwnerGroupsExclude)
	cfg.HostIPv4LoopbackCidr = get(r, envIstioOutboundIPv4LoopbackCIDR)
	return cfg, c.s.Problems.Err()
}
