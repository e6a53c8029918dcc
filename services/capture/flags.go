package capture

import (
	"fmt"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Flags is the istio-iptables command line bound to a Config. Every flag but
// --envoy-port also reads env UPPER(name, '-'→'_') as its default (Istio's
// pkg/flag.BindEnv); the command line wins.
type Flags struct {
	cfg    *Config
	getenv func(string) string
	// envErrs collects bad env values: reported by Finish, naming the var.
	envErrs []error
}

// BindFlags defines istio-iptables' flags on fs, filling cfg. getenv is
// os.Getenv in production (injectable for tests). lookupUID resolves
// $ENVOY_USER for the --proxy-uid default (nil: os/user).
func BindFlags(fs *pflag.FlagSet, cfg *Config, getenv func(string) string, lookupUID func(name string) (string, error)) *Flags {
	f := &Flags{cfg: cfg, getenv: getenv}
	d := Default()
	if lookupUID == nil {
		lookupUID = func(name string) (string, error) {
			u, err := user.Lookup(name)
			if err != nil {
				return "", err
			}
			return u.Uid, nil
		}
	}
	envoyUser := getenv("ENVOY_USER")
	if envoyUser == "" {
		envoyUser = "istio-proxy"
	}
	if uid, err := lookupUID(envoyUser); err == nil {
		d.ProxyUID = uid
	} else {
		d.ProxyUID = "1337"
	}

	fs.StringVarP(&cfg.ProxyPort, "envoy-port", "p", d.ProxyPort, "Envoy port to which all outbound TCP traffic is redirected")
	f.str(fs, &cfg.InboundCapturePort, "inbound-capture-port", "z", d.InboundCapturePort, "Port to which all inbound TCP traffic is redirected")
	f.str(fs, &cfg.InboundTunnelPort, "inbound-tunnel-port", "e", d.InboundTunnelPort, "Envoy's HBONE tunnel port (never captured)")
	f.str(fs, &cfg.ProxyUID, "proxy-uid", "u", d.ProxyUID, "UID(s) of the proxy, comma separated: their traffic is not captured (default: uid of $ENVOY_USER, else 1337)")
	f.str(fs, &cfg.ProxyGID, "proxy-gid", "g", "", "GID(s) of the proxy, comma separated (default: same as --proxy-uid)")
	f.str(fs, &cfg.InboundInterceptionMode, "istio-inbound-interception-mode", "m", "", "Inbound interception mode: REDIRECT or TPROXY")
	f.str(fs, &cfg.InboundTProxyMark, "istio-inbound-tproxy-mark", "t", d.InboundTProxyMark, "Packet mark used by TPROXY mode")
	f.str(fs, &cfg.InboundTProxyRouteTable, "istio-inbound-tproxy-route-table", "r", d.InboundTProxyRouteTable, "Routing table used by TPROXY mode")
	f.str(fs, &cfg.InboundPortsInclude, "istio-inbound-ports", "b", "", `Inbound ports to capture, comma separated; "*" for all; empty for none`)
	f.str(fs, &cfg.InboundPortsExclude, "istio-local-exclude-ports", "d", "", `Inbound ports not to capture (with -b "*")`)
	f.str(fs, &cfg.ExcludeInterfaces, "istio-exclude-interfaces", "c", "", "Interfaces whose traffic is never captured")
	f.str(fs, &cfg.OutboundIPRangesInclude, "istio-service-cidr", "i", "", `Outbound CIDRs to capture; "*" for all; empty for none`)
	f.str(fs, &cfg.OutboundIPRangesExclude, "istio-service-exclude-cidr", "x", "", "Outbound CIDRs never captured")
	f.str(fs, &cfg.OutboundPortsInclude, "istio-outbound-ports", "q", "", "Outbound ports always captured")
	f.str(fs, &cfg.OutboundPortsExclude, "istio-local-outbound-ports-exclude", "o", "", "Outbound ports never captured")
	f.str(fs, &cfg.RerouteVirtualInterfaces, "kube-virt-interfaces", "k", "", "Virtual interfaces whose inbound traffic is treated as outbound")
	f.boolean(fs, &cfg.DryRun, "dry-run", "n", "Print the rules; change nothing")
	f.port(fs, &cfg.IptablesProbePort, "iptables-probe-port", d.IptablesProbePort, "Port the validation probe dials")
	f.duration(fs, &cfg.ProbeTimeout, "probe-timeout", d.ProbeTimeout, "Validation probe timeout")
	f.boolean(fs, &cfg.SkipRuleApply, "skip-rule-apply", "", "Do not program rules (validate only)")
	f.boolean(fs, &cfg.RunValidation, "run-validation", "", "Check with a probe connection that capture works")
	f.boolean(fs, &cfg.RedirectDNS, "redirect-dns", "", "Redirect DNS to the agent's DNS proxy (15053)", "ISTIO_META_DNS_CAPTURE")
	f.boolean(fs, &cfg.DropInvalid, "drop-invalid", "", "Drop packets conntrack marks INVALID", "INVALID_DROP")
	f.boolean(fs, &cfg.DualStack, "dual-stack", "", "Dual-stack host", "ISTIO_DUAL_STACK")
	f.boolean(fs, &cfg.CaptureAllDNS, "capture-all-dns", "", "Capture DNS to any server, not only resolv.conf's")
	f.str(fs, &cfg.NetworkNamespace, "network-namespace", "", "", "Network namespace to program (CNI); not supported by meshagent")
	f.boolean(fs, &cfg.CNIMode, "cni-mode", "", "Running inside the CNI plugin")
	f.boolean(fs, &cfg.Reconcile, "reconcile", "", "Replace drifted rules")
	f.boolean(fs, &cfg.CleanupOnly, "cleanup-only", "", "Only remove the rules")
	f.boolean(fs, &cfg.ForceApply, "force-apply", "", "Apply even if the rules are already in place")
	f.boolean(fs, &cfg.NativeNftables, "native-nftables", "", "Use the nftables backend (not supported)")
	f.str(fs, &cfg.ForceIptablesBinary, "force-iptables-binary", "", "", `Force the iptables binary: "legacy" or "nft"`)
	return f
}

// Finish applies what flags cannot: the GID default, the env-only settings
// (ISTIO_OUTBOUND_OWNER_GROUPS[_EXCLUDE], ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR),
// and reports bad env values.
func (f *Flags) Finish() error {
	if f.cfg.ProxyGID == "" {
		f.cfg.ProxyGID = f.cfg.ProxyUID
	}
	f.cfg.OwnerGroupsInclude = "*"
	if v, ok := f.env("ISTIO_OUTBOUND_OWNER_GROUPS"); ok {
		f.cfg.OwnerGroupsInclude = v
	}
	f.cfg.OwnerGroupsExclude, _ = f.env("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE")
	f.cfg.HostIPv4LoopbackCidr = "127.0.0.1/32"
	if v, ok := f.env("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"); ok {
		f.cfg.HostIPv4LoopbackCidr = v
	}
	if len(f.envErrs) > 0 {
		return f.envErrs[0]
	}
	return nil
}

func envName(flag string) string { return strings.ToUpper(strings.ReplaceAll(flag, "-", "_")) }

func (f *Flags) env(name string) (string, bool) {
	v := f.getenv(name)
	return v, v != ""
}

func (f *Flags) str(fs *pflag.FlagSet, p *string, name, short, def, usage string) {
	if v, ok := f.env(envName(name)); ok {
		def = v
	}
	fs.StringVarP(p, name, short, def, usage+" (env "+envName(name)+")")
}

func (f *Flags) boolean(fs *pflag.FlagSet, p *bool, name, short, usage string, aliases ...string) {
	def := false
	for _, env := range append([]string{envName(name)}, aliases...) {
		if v, ok := f.env(env); ok {
			b, err := strconv.ParseBool(v)
			if err != nil {
				f.envErrs = append(f.envErrs, fmt.Errorf("%w: env %s %q: not a boolean", ErrInvalidConfig, env, v))
				break
			}
			def = b
			break
		}
	}
	fs.BoolVarP(p, name, short, def, usage+" (env "+strings.Join(append([]string{envName(name)}, aliases...), ", ")+")")
}

func (f *Flags) port(fs *pflag.FlagSet, p *uint16, name string, def uint16, usage string) {
	if v, ok := f.env(envName(name)); ok {
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			f.envErrs = append(f.envErrs, fmt.Errorf("%w: env %s %q: not a port", ErrInvalidConfig, envName(name), v))
		} else {
			def = uint16(n)
		}
	}
	fs.Uint16Var(p, name, def, usage+" (env "+envName(name)+")")
}

func (f *Flags) duration(fs *pflag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	if v, ok := f.env(envName(name)); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			f.envErrs = append(f.envErrs, fmt.Errorf("%w: env %s %q: not a duration", ErrInvalidConfig, envName(name), v))
		} else {
			def = d
		}
	}
	fs.DurationVar(p, name, def, usage+" (env "+envName(name)+")")
}
