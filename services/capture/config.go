// Package capture programs Istio-compatible traffic capture with either of
// Istio's backends: the iptables rules istio-iptables (pilot-agent
// istio-iptables) writes, built as iptables-restore input and applied with
// one restore per address family; or, with --native-nftables, Istio's
// nftables tables, applied as one nft transaction (nft.go, nft_apply.go).
// Both are verified, reconciled and removed; backend.go chooses between them
// once per node; a tree service checks (sidecar) or owns (VM) the rules.
package capture

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// RulesConfig mirrors Istio's tools/common/config.Config field for field (names
// as Istio's). String fields hold what the flag or env var held: every
// field is the caller's, the defaults of the variables in cmd's env table
// (#34), istio-iptables' flag-only --envoy-port and its uid 1337 in cmd's
// table of Istio's names. A field tagged env:"NAME" takes that variable's
// value (the test kit fills it from the table: testkit.FillFromTable).
type RulesConfig struct {
	ProxyPort                string        // -p --envoy-port
	InboundCapturePort       string        `env:"INBOUND_CAPTURE_PORT"` // -z --inbound-capture-port
	InboundTunnelPort        string        `env:"INBOUND_TUNNEL_PORT"`  // -e --inbound-tunnel-port
	ProxyUID                 string        // -u --proxy-uid, comma list
	ProxyGID                 string        // -g --proxy-gid, comma list (default = ProxyUID)
	InboundInterceptionMode  string        // -m: "" / REDIRECT / TPROXY
	InboundTProxyMark        string        `env:"ISTIO_INBOUND_TPROXY_MARK"`        // -t
	InboundTProxyRouteTable  string        `env:"ISTIO_INBOUND_TPROXY_ROUTE_TABLE"` // -r
	InboundPortsInclude      string        // -b: "" none, "*" all, or list
	InboundPortsExclude      string        // -d: only used with -b '*'
	OwnerGroupsInclude       string        `env:"ISTIO_OUTBOUND_OWNER_GROUPS"`
	OwnerGroupsExclude       string        // env ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE
	OutboundPortsInclude     string        // -q
	OutboundPortsExclude     string        // -o
	OutboundIPRangesInclude  string        // -i: "" none, "*" all, or CIDR list
	OutboundIPRangesExclude  string        // -x: CIDR list ("*" is an error for IPv4)
	RerouteVirtualInterfaces string        // -k
	ExcludeInterfaces        string        // -c
	IptablesProbePort        uint16        `env:"IPTABLES_PROBE_PORT"` // --iptables-probe-port
	ProbeTimeout             time.Duration `env:"PROBE_TIMEOUT"`       // --probe-timeout
	DryRun                   bool          // -n --dry-run
	SkipRuleApply            bool          // --skip-rule-apply
	RunValidation            bool          // --run-validation
	RedirectDNS              bool          // --redirect-dns (env REDIRECT_DNS, ISTIO_META_DNS_CAPTURE)
	DropInvalid              bool          // --drop-invalid (env DROP_INVALID, INVALID_DROP)
	CaptureAllDNS            bool          // --capture-all-dns
	EnableIPv6               bool          // not a flag: from the host's first global address
	DNSServersV4             []string      // from resolv.conf (re-rendered by netip)
	DNSServersV6             []string
	NetworkNamespace         string     // --network-namespace
	CNIMode                  bool       // --cni-mode
	HostIPv4LoopbackCidr     string     `env:"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"`
	HostIP                   netip.Addr // the address EnableIPv6 was decided from
	DualStack                bool       // --dual-stack
	Reconcile                bool       // --reconcile
	CleanupOnly              bool       // --cleanup-only
	ForceApply               bool       // --force-apply
	NativeNftables           bool       // --native-nftables
	ForceIptablesBinary      string     // --force-iptables-binary: "", legacy, nft
}

// ErrInvalidConfig wraps every validation error.
var ErrInvalidConfig = errors.New("invalid capture config")

// maxOwnerGroups is Istio's limit on ISTIO_OUTBOUND_OWNER_GROUPS entries
// (each becomes one owner match in a single rule).
const maxOwnerGroups = 64

// Validate checks every field and names the flag (or env var) and value in
// its error. Stricter than Istio in two places, on purpose: unparsable CIDRs
// (Istio skips them "for bug compatibility") and unknown interception modes
// (Istio silently treats them as REDIRECT) are errors here.
func (c RulesConfig) Validate() error {
	var errs []error
	bad := func(flag, value, why string) {
		errs = append(errs, fmt.Errorf("%w: %s %q: %s", ErrInvalidConfig, flag, value, why))
	}
	for _, p := range []struct{ flag, v string }{
		{"--envoy-port", c.ProxyPort},
		{"--inbound-capture-port", c.InboundCapturePort},
		{"--inbound-tunnel-port", c.InboundTunnelPort},
	} {
		if err := checkPort(p.v); err != nil {
			bad(p.flag, p.v, err.Error())
		}
	}
	for _, p := range []struct{ flag, v string }{
		{"--istio-local-exclude-ports", c.InboundPortsExclude},
		{"--istio-outbound-ports", c.OutboundPortsInclude},
		{"--istio-local-outbound-ports-exclude", c.OutboundPortsExclude},
	} {
		if err := checkEach(p.v, checkPort); err != nil {
			bad(p.flag, p.v, err.Error())
		}
	}
	if c.InboundPortsInclude != "*" {
		if err := checkEach(c.InboundPortsInclude, checkPort); err != nil {
			bad("--istio-inbound-ports", c.InboundPortsInclude, err.Error()+` (or "*")`)
		}
	}
	if len(Split(c.ProxyUID)) == 0 {
		bad("--proxy-uid", c.ProxyUID, "at least one UID is required")
	}
	if err := checkEach(c.ProxyUID, checkID("UID")); err != nil {
		bad("--proxy-uid", c.ProxyUID, err.Error())
	}
	if err := checkEach(c.ProxyGID, checkID("GID")); err != nil {
		bad("--proxy-gid", c.ProxyGID, err.Error())
	}
	switch c.InboundInterceptionMode {
	case "", "REDIRECT", "TPROXY":
	default:
		bad("--istio-inbound-interception-mode", c.InboundInterceptionMode, "must be REDIRECT or TPROXY")
	}
	if _, err := strconv.ParseUint(c.InboundTProxyMark, 10, 32); err != nil {
		bad("--istio-inbound-tproxy-mark", c.InboundTProxyMark, "must be a number (a packet mark)")
	}
	if n, err := strconv.ParseUint(c.InboundTProxyRouteTable, 10, 32); err != nil || n == 0 {
		bad("--istio-inbound-tproxy-route-table", c.InboundTProxyRouteTable, "must be a routing table number 1..4294967295")
	}
	if c.OutboundIPRangesInclude != "*" {
		if err := checkEach(c.OutboundIPRangesInclude, checkCIDR); err != nil {
			bad("--istio-service-cidr", c.OutboundIPRangesInclude, err.Error()+` (or "*")`)
		}
	}
	if c.OutboundIPRangesExclude == "*" {
		bad("--istio-service-exclude-cidr", c.OutboundIPRangesExclude, `"*" is not allowed (it would exclude everything)`)
	} else if err := checkEach(c.OutboundIPRangesExclude, checkCIDR); err != nil {
		bad("--istio-service-exclude-cidr", c.OutboundIPRangesExclude, err.Error())
	}
	for _, f := range []struct{ flag, v string }{
		{"--kube-virt-interfaces", c.RerouteVirtualInterfaces},
		{"--istio-exclude-interfaces", c.ExcludeInterfaces},
	} {
		if err := checkEach(f.v, checkInterface); err != nil {
			bad(f.flag, f.v, err.Error())
		}
	}
	if c.OwnerGroupsInclude != "*" && len(Split(c.OwnerGroupsInclude)) > maxOwnerGroups {
		bad("ISTIO_OUTBOUND_OWNER_GROUPS", c.OwnerGroupsInclude,
			fmt.Sprintf("%d groups, at most %d are allowed", len(Split(c.OwnerGroupsInclude)), maxOwnerGroups))
	}
	for _, g := range append(Split(c.OwnerGroupsInclude), Split(c.OwnerGroupsExclude)...) {
		if g != "*" && strings.ContainsAny(g, " \t\n!") {
			bad("ISTIO_OUTBOUND_OWNER_GROUPS", g, "not a group name or GID")
			break
		}
	}
	if err := checkLoopbackCIDR(c.HostIPv4LoopbackCidr); err != nil {
		bad("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", c.HostIPv4LoopbackCidr, err.Error())
	}
	if c.IptablesProbePort == 0 {
		bad("--iptables-probe-port", "0", "must be 1..65535")
	}
	if c.RunValidation && c.ProbeTimeout <= 0 {
		bad("--probe-timeout", c.ProbeTimeout.String(), "must be positive")
	}
	switch c.ForceIptablesBinary {
	case "", "legacy", "nft":
	default:
		bad("--force-iptables-binary", c.ForceIptablesBinary, `must be "legacy" or "nft"`)
	}
	if c.NativeNftables && c.ForceIptablesBinary != "" {
		bad("--native-nftables", "true", "cannot be combined with --force-iptables-binary")
	}
	for _, s := range c.DNSServersV4 {
		if a, err := netip.ParseAddr(s); err != nil || !a.Is4() {
			bad("DNSServersV4", s, "not an IPv4 address")
		}
	}
	for _, s := range c.DNSServersV6 {
		if a, err := netip.ParseAddr(s); err != nil || !a.Is6() {
			bad("DNSServersV6", s, "not an IPv6 address")
		}
	}
	return errors.Join(errs...)
}

// Split splits a comma list, dropping empty items (so "6000,7000," is two
// ports) and surrounding spaces.
func Split(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

func checkPort(s string) error {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return fmt.Errorf("%q is not a port (1..65535)", s)
	}
	return nil
}

// checkEach checks every element of a comma-separated list: the first
// that fails is the error, one a flag.
func checkEach(list string, check func(string) error) error {
	for _, s := range Split(list) {
		if err := check(s); err != nil {
			return err
		}
	}
	return nil
}

func checkCIDR(s string) error {
	if _, err := netip.ParsePrefix(s); err != nil {
		return fmt.Errorf("%q is not a CIDR (like 10.0.0.0/8 or 2001:db8::/32)", s)
	}
	return nil
}

// checkID is the check of a numeric user or group ID (what: UID or GID).
func checkID(what string) func(string) error {
	return func(id string) error {
		if _, err := strconv.ParseUint(id, 10, 32); err != nil {
			return fmt.Errorf("%q is not a numeric %s", id, what)
		}
		return nil
	}
}

// checkInterface accepts what the kernel accepts as a name (1..15 bytes, no
// '/', ':' or whitespace), plus iptables' trailing '+' wildcard.
func checkInterface(name string) error {
	if len(name) > 15 {
		return fmt.Errorf("interface name %q is longer than 15 characters", name)
	}
	if name == "." || name == ".." || strings.ContainsAny(name, "/: \t\n!") {
		return fmt.Errorf("%q is not a valid interface name", name)
	}
	return nil
}

func checkLoopbackCIDR(s string) error {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return fmt.Errorf("not a CIDR")
	}
	if !p.Addr().Is4() || !p.Addr().IsLoopback() {
		return fmt.Errorf("must be an IPv4 loopback range (127.0.0.0/8)")
	}
	if p.Bits() < 8 || p.Bits() > 32 {
		return fmt.Errorf("mask must be between 8 and 32")
	}
	return nil
}
