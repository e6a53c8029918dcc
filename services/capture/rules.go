package capture

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Chains and constants of Istio's capture (tools/istio-iptables/pkg/constants).
const (
	ChainInbound    = "ISTIO_INBOUND"
	ChainRedirect   = "ISTIO_REDIRECT"
	ChainInRedirect = "ISTIO_IN_REDIRECT"
	ChainOutput     = "ISTIO_OUTPUT"
	ChainOutputDNS  = "ISTIO_OUTPUT_DNS"
	ChainDivert     = "ISTIO_DIVERT"
	ChainTProxy     = "ISTIO_TPROXY"
	ChainDrop       = "ISTIO_DROP"

	// OutboundMark marks Envoy's own loopback traffic to the app in TPROXY mode.
	OutboundMark = "1338"
	// DNSListenerPort is the agent's DNS proxy port DNS is redirected to.
	DNSListenerPort = "15053"
	// ChainPrefix marks every chain this package owns.
	ChainPrefix = "ISTIO_"

	// multiportMax is the most ports one "-m multiport" match accepts.
	multiportMax = 15
)

// Rule is one iptables rule: "-A Chain Params..." or, when Position > 0,
// "-I Chain Position Params...".
type Rule struct {
	Table    string
	Chain    string
	Position int
	Params   []string
}

// Spec is the rule as iptables-restore / iptables take it after "-t table".
func (r Rule) Spec() string {
	if r.Position > 0 {
		return "-I " + r.Chain + " " + strconv.Itoa(r.Position) + " " + strings.Join(r.Params, " ")
	}
	return "-A " + r.Chain + " " + strings.Join(r.Params, " ")
}

// Target is the chain or target after -j ("" if none).
func (r Rule) Target() string {
	if n := len(r.Params); n >= 2 && r.Params[n-2] == "-j" {
		return r.Params[n-1]
	}
	return ""
}

// RuleSet is the complete capture for one host: the IPv4 rules and, when
// IPv6 is enabled, the IPv6 rules, in build order.
type RuleSet struct {
	V4, V6 []Rule
	IPv6   bool
}

// builder accumulates rules in Istio's build order. "Both" appends to v4 and
// v6; a versioned rule substitutes a per-family literal.
type builder struct {
	v4, v6 []Rule
}

// ipPlaceholder is replaced by the family's literal in versioned rules.
const ipPlaceholder = "$IP"

func (b *builder) both(table, chain string, params ...string) {
	b.v4 = append(b.v4, Rule{Table: table, Chain: chain, Params: params})
	b.v6 = append(b.v6, Rule{Table: table, Chain: chain, Params: params})
}
func (b *builder) only4(table, chain string, params ...string) {
	b.v4 = append(b.v4, Rule{Table: table, Chain: chain, Params: params})
}
func (b *builder) only6(table, chain string, params ...string) {
	b.v6 = append(b.v6, Rule{Table: table, Chain: chain, Params: params})
}
func (b *builder) insert(table, chain string, pos int, params ...string) {
	b.v4 = append(b.v4, Rule{Table: table, Chain: chain, Position: pos, Params: params})
	b.v6 = append(b.v6, Rule{Table: table, Chain: chain, Position: pos, Params: params})
}
func (b *builder) versioned(v4, v6, table, chain string, params ...string) {
	b.only4(table, chain, substitute(params, v4)...)
	b.only6(table, chain, substitute(params, v6)...)
}

func substitute(params []string, v string) []string {
	out := slices.Clone(params)
	for i, p := range out {
		if p == ipPlaceholder {
			out[i] = v
		}
	}
	return out
}

// familyRanges is one family's half of a CIDR list.
type familyRanges struct {
	wildcard bool
	cidrs    []netip.Prefix
	loopback bool
}

func splitRanges(list string) (v4, v6 familyRanges) {
	if list == "*" {
		return familyRanges{wildcard: true}, familyRanges{wildcard: true}
	}
	for _, s := range Split(list) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			continue // Validate rejects these; Build stays total.
		}
		r := &v6
		if p.Addr().Is4() {
			r = &v4
		}
		r.cidrs = append(r.cidrs, p)
		r.loopback = r.loopback || p.Addr().IsLoopback()
	}
	return v4, v6
}

// Build produces the rules istio-iptables (run.go @8b6c97ac) produces for cfg,
// in the same order. cfg should have passed Validate.
func Build(cfg RulesConfig) RuleSet {
	b := &builder{}
	tproxy := cfg.InboundInterceptionMode == "TPROXY"
	lo4 := cfg.HostIPv4LoopbackCidr
	const lo6 = "::1/128"
	exclude4, exclude6 := splitRanges(cfg.OutboundIPRangesExclude)
	include4, include6 := splitRanges(cfg.OutboundIPRangesInclude)
	redirectDNS := cfg.RedirectDNS && (cfg.CaptureAllDNS || len(cfg.DNSServersV4)+len(cfg.DNSServersV6) > 0)
	uids, gids := Split(cfg.ProxyUID), Split(cfg.ProxyGID)

	// 1. Interfaces whose traffic is never captured.
	for _, nic := range Split(cfg.ExcludeInterfaces) {
		b.both("nat", "PREROUTING", "-i", nic, "-j", "RETURN")
		b.both("nat", "OUTPUT", "-o", nic, "-j", "RETURN")
	}
	if tproxy {
		for _, nic := range Split(cfg.ExcludeInterfaces) {
			b.both("mangle", "PREROUTING", "-i", nic, "-j", "RETURN")
			b.both("mangle", "OUTPUT", "-o", nic, "-j", "RETURN")
		}
	}
	// 2. Kube-virt interfaces: their inbound traffic is not inbound capture.
	for _, nic := range Split(cfg.RerouteVirtualInterfaces) {
		b.insert("nat", "PREROUTING", 1, "-i", nic, "-j", "RETURN")
	}
	// 3. Drop out-of-window packets rather than let them reset connections.
	if cfg.DropInvalid {
		b.both("mangle", "PREROUTING", "-m", "conntrack", "--ctstate", "INVALID", "-j", ChainDrop)
		b.both("mangle", ChainDrop, "-j", "DROP")
	}
	// 4. The tunnel (HBONE) port is never captured; the two redirect chains.
	b.both("nat", ChainInbound, "-p", "tcp", "--dport", cfg.InboundTunnelPort, "-j", "RETURN")
	b.both("nat", ChainRedirect, "-p", "tcp", "-j", "REDIRECT", "--to-ports", cfg.ProxyPort)
	b.both("nat", ChainInRedirect, "-p", "tcp", "-j", "REDIRECT", "--to-ports", cfg.InboundCapturePort)
	// 5. Inbound.
	buildInbound(b, cfg, tproxy, lo4, lo6)
	// 6. All outbound traffic (UDP too, for DNS) goes through ISTIO_OUTPUT.
	b.both("nat", "OUTPUT", "-j", ChainOutput)
	// 7. Outbound port exclusions, before anything can redirect.
	if ports := Split(cfg.OutboundPortsExclude); len(ports) > 0 {
		multiportRules(ports, func(match ...string) {
			b.both("nat", ChainOutput, append(append([]string{"-p", "tcp"}, match...), "-j", "RETURN")...)
		})
		multiportRules(ports, func(match ...string) {
			b.both("nat", ChainOutput, append(append([]string{"-p", "udp"}, match...), "-j", "RETURN")...)
		})
	}
	// 8. Inbound passthrough connections (Envoy binds 127.0.0.6 / ::6).
	b.versioned("127.0.0.6/32", "::6/128", "nat", ChainOutput, "-o", "lo", "-s", ipPlaceholder, "-j", "RETURN")
	// 9. The proxy's own traffic.
	loopbackIncluded := include4.loopback || include6.loopback
	for _, uid := range uids {
		ownerRules(b, "--uid-owner", uid, redirectDNS, redirectDNS, loopbackIncluded, cfg.InboundTunnelPort, lo4, lo6)
	}
	for _, gid := range gids {
		// Istio never gives the gid's first rule the port-53 variant.
		ownerRules(b, "--gid-owner", gid, false, redirectDNS, loopbackIncluded, cfg.InboundTunnelPort, lo4, lo6)
	}
	// 10. Owner groups.
	include, except := ownerGroupFilter(cfg)
	if except {
		for _, g := range include {
			b.both("nat", ChainOutput, "-m", "owner", "--gid-owner", g, "-j", "RETURN")
		}
	} else {
		var params []string
		for _, g := range include {
			params = append(params, "-m", "owner", "!", "--gid-owner", g)
		}
		b.both("nat", ChainOutput, append(params, "-j", "RETURN")...)
	}
	// 11. DNS.
	if redirectDNS {
		buildDNS(b, cfg, uids, gids)
	}
	// 12. Localhost and excluded ranges are never captured.
	b.versioned(lo4, lo6, "nat", ChainOutput, "-d", ipPlaceholder, "-j", "RETURN")
	for _, p := range exclude4.cidrs {
		b.only4("nat", ChainOutput, "-d", p.String(), "-j", "RETURN")
	}
	for _, p := range exclude6.cidrs {
		b.only6("nat", ChainOutput, "-d", p.String(), "-j", "RETURN")
	}
	// 13. Outbound ports always captured.
	for _, port := range Split(cfg.OutboundPortsInclude) {
		b.both("nat", ChainOutput, "-p", "tcp", "--dport", port, "-j", ChainRedirect)
	}
	// 14. Outbound ranges captured.
	includeRules(b, include4, cfg, b.only4, func(params ...string) {
		b.v4 = append(b.v4, Rule{Table: "nat", Chain: "PREROUTING", Position: 1, Params: params})
	})
	includeRules(b, include6, cfg, b.only6, func(params ...string) {
		b.v6 = append(b.v6, Rule{Table: "nat", Chain: "PREROUTING", Position: 1, Params: params})
	})
	// 15. TPROXY marks and loop prevention.
	if tproxy {
		mark := cfg.InboundTProxyMark
		b.both("mangle", "PREROUTING", "-p", "tcp", "-m", "mark", "--mark", mark, "-j", "CONNMARK", "--save-mark")
		b.both("mangle", "OUTPUT", "-p", "tcp", "-o", "lo", "-m", "mark", "--mark", mark, "-j", "RETURN")
		for _, o := range append(prefixed("--uid-owner", uids), prefixed("--gid-owner", gids)...) {
			b.versioned(lo4, lo6, "mangle", "OUTPUT", "!", "-d", ipPlaceholder, "-p", "tcp", "-o", "lo",
				"-m", "owner", o[0], o[1], "-j", "MARK", "--set-mark", OutboundMark)
		}
		b.both("mangle", "OUTPUT", "-p", "tcp", "-m", "connmark", "--mark", mark, "-j", "CONNMARK", "--restore-mark")
		b.insert("mangle", ChainInbound, 1, "-p", "tcp", "-m", "mark", "--mark", mark, "-j", "RETURN")
		b.v4 = append(b.v4, Rule{Table: "mangle", Chain: ChainInbound, Position: 2,
			Params: []string{"-p", "tcp", "-s", "127.0.0.6/32", "-i", "lo", "-j", "RETURN"}})
		b.v6 = append(b.v6, Rule{Table: "mangle", Chain: ChainInbound, Position: 2,
			Params: []string{"-p", "tcp", "-s", "::6/128", "-i", "lo", "-j", "RETURN"}})
		b.insert("mangle", ChainInbound, 3, "-p", "tcp", "-i", "lo", "-m", "mark", "!", "--mark", OutboundMark, "-j", "RETURN")
	}
	rs := RuleSet{V4: b.v4, IPv6: cfg.EnableIPv6}
	if cfg.EnableIPv6 {
		rs.V6 = b.v6
	}
	return rs
}

func buildInbound(b *builder, cfg RulesConfig, tproxy bool, lo4, lo6 string) {
	if cfg.InboundPortsInclude == "" {
		return
	}
	table := "nat"
	if tproxy {
		table = "mangle"
		b.both("mangle", ChainDivert, "-j", "MARK", "--set-mark", cfg.InboundTProxyMark)
		b.both("mangle", ChainDivert, "-j", "ACCEPT")
		b.versioned(lo4, lo6, "mangle", ChainTProxy, "!", "-d", ipPlaceholder, "-p", "tcp", "-j", "TPROXY",
			"--tproxy-mark", cfg.InboundTProxyMark+"/0xffffffff", "--on-port", cfg.InboundCapturePort)
	}
	b.both(table, "PREROUTING", "-p", "tcp", "-j", ChainInbound)
	if cfg.InboundPortsInclude == "*" {
		if ports := Split(cfg.InboundPortsExclude); len(ports) > 0 {
			multiportRules(ports, func(match ...string) {
				b.both(table, ChainInbound, append(append([]string{"-p", "tcp"}, match...), "-j", "RETURN")...)
			})
		}
		if tproxy {
			b.both("mangle", ChainInbound, "-p", "tcp", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", ChainDivert)
			b.both("mangle", ChainInbound, "-p", "tcp", "-j", ChainTProxy)
		} else {
			b.both("nat", ChainInbound, "-p", "tcp", "-j", ChainInRedirect)
		}
		return
	}
	for _, port := range Split(cfg.InboundPortsInclude) {
		if tproxy {
			b.both("mangle", ChainInbound, "-p", "tcp", "--dport", port, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", ChainDivert)
			b.both("mangle", ChainInbound, "-p", "tcp", "--dport", port, "-j", ChainTProxy)
		} else {
			b.both("nat", ChainInbound, "-p", "tcp", "--dport", port, "-j", ChainInRedirect)
		}
	}
}

// ownerRules are the three rules for one proxy uid or gid: loop back to
// inbound for app calls via a VIP, skip loopback traffic of others, and never
// capture the proxy itself.
func ownerRules(b *builder, match, id string, dnsFirst, dnsSecond, loopbackIncluded bool, tunnelPort, lo4, lo6 string) {
	if dnsFirst {
		b.versioned(lo4, lo6, "nat", ChainOutput, "-o", "lo", "!", "-d", ipPlaceholder, "-p", "tcp",
			"-m", "multiport", "!", "--dports", "53,"+tunnelPort, "-m", "owner", match, id, "-j", ChainInRedirect)
	} else {
		b.versioned(lo4, lo6, "nat", ChainOutput, "-o", "lo", "!", "-d", ipPlaceholder, "-p", "tcp",
			"!", "--dport", tunnelPort, "-m", "owner", match, id, "-j", ChainInRedirect)
	}
	if !loopbackIncluded {
		if dnsSecond {
			b.both("nat", ChainOutput, "-o", "lo", "-p", "tcp", "!", "--dport", "53", "-m", "owner", "!", match, id, "-j", "RETURN")
		} else {
			b.both("nat", ChainOutput, "-o", "lo", "-m", "owner", "!", match, id, "-j", "RETURN")
		}
	}
	b.both("nat", ChainOutput, "-m", "owner", match, id, "-j", "RETURN")
}

// ownerGroupFilter is Istio's InterceptFilter: include "*" (or empty) means
// "all groups except the exclude list"; otherwise only the listed groups.
func ownerGroupFilter(cfg RulesConfig) (values []string, except bool) {
	if inc := strings.TrimSpace(cfg.OwnerGroupsInclude); inc == "*" || inc == "" {
		return Split(cfg.OwnerGroupsExclude), true
	}
	return Split(cfg.OwnerGroupsInclude), false
}

func buildDNS(b *builder, cfg RulesConfig, uids, gids []string) {
	all := cfg.CaptureAllDNS
	b.both("raw", "OUTPUT", "-j", ChainOutputDNS)
	if all || len(cfg.DNSServersV4) > 0 {
		b.only4("nat", ChainOutput, "-j", ChainOutputDNS)
	}
	if all || len(cfg.DNSServersV6) > 0 {
		b.only6("nat", ChainOutput, "-j", ChainOutputDNS)
	}
	for _, proto := range []string{"tcp", "udp"} {
		toPort := "--to-ports"
		if proto == "udp" {
			toPort = "--to-port" // Istio's spelling; iptables accepts both.
		}
		if all {
			b.both("nat", ChainOutputDNS, "-p", proto, "--dport", "53", "-j", "REDIRECT", toPort, DNSListenerPort)
			continue
		}
		for _, s := range cfg.DNSServersV4 {
			b.only4("nat", ChainOutputDNS, "-p", proto, "--dport", "53", "-d", s+"/32", "-j", "REDIRECT", toPort, DNSListenerPort)
		}
		for _, s := range cfg.DNSServersV6 {
			b.only6("nat", ChainOutputDNS, "-p", proto, "--dport", "53", "-d", s+"/128", "-j", "REDIRECT", toPort, DNSListenerPort)
		}
	}
	// Conntrack zones: proxy<->upstream in zone 1, app<->proxy in zone 2, so
	// the two legs of a redirected UDP query never collide.
	for _, o := range append(prefixed("--uid-owner", uids), prefixed("--gid-owner", gids)...) {
		b.both("raw", ChainOutputDNS, "-p", "udp", "--dport", "53", "-m", "owner", o[0], o[1], "-j", "CT", "--zone", "1")
		b.both("raw", ChainOutputDNS, "-p", "udp", "--sport", DNSListenerPort, "-m", "owner", o[0], o[1], "-j", "CT", "--zone", "2")
	}
	if all {
		b.both("raw", "PREROUTING", "-j", ChainInbound)
		b.both("raw", ChainOutputDNS, "-p", "udp", "--dport", "53", "-j", "CT", "--zone", "2")
		b.both("raw", ChainInbound, "-p", "udp", "--sport", "53", "-j", "CT", "--zone", "1")
		return
	}
	if len(cfg.DNSServersV4) > 0 {
		b.only4("raw", "PREROUTING", "-j", ChainInbound)
	}
	for _, s := range cfg.DNSServersV4 {
		b.only4("raw", ChainOutputDNS, "-p", "udp", "--dport", "53", "-d", s+"/32", "-j", "CT", "--zone", "2")
		b.only4("raw", ChainInbound, "-p", "udp", "--sport", "53", "-s", s+"/32", "-j", "CT", "--zone", "1")
	}
	if len(cfg.DNSServersV6) > 0 {
		b.only6("raw", "PREROUTING", "-j", ChainInbound)
	}
	for _, s := range cfg.DNSServersV6 {
		b.only6("raw", ChainOutputDNS, "-p", "udp", "--dport", "53", "-d", s+"/128", "-j", "CT", "--zone", "2")
		b.only6("raw", ChainInbound, "-p", "udp", "--sport", "53", "-s", s+"/128", "-j", "CT", "--zone", "1")
	}
}

func includeRules(b *builder, r familyRanges, cfg RulesConfig, appendRule func(table, chain string, params ...string), insertPrerouting func(params ...string)) {
	if r.wildcard {
		appendRule("nat", ChainOutput, "-j", ChainRedirect)
		for _, nic := range Split(cfg.RerouteVirtualInterfaces) {
			insertPrerouting("-i", nic, "-j", ChainRedirect)
		}
		return
	}
	for _, p := range r.cidrs {
		for _, nic := range Split(cfg.RerouteVirtualInterfaces) {
			insertPrerouting("-i", nic, "-d", p.String(), "-j", ChainRedirect)
		}
		appendRule("nat", ChainOutput, "-d", p.String(), "-j", ChainRedirect)
	}
}

// multiportRules emits the port match for a port list: one port as
// "--dport P", more as "-m multiport --dports a,b,..." in chunks of at most
// 15 ports (the kernel's multiport limit).
func multiportRules(ports []string, emit func(match ...string)) {
	if len(ports) == 1 {
		emit("--dport", ports[0])
		return
	}
	for chunk := range slices.Chunk(ports, multiportMax) {
		emit("-m", "multiport", "--dports", strings.Join(chunk, ","))
	}
}

func prefixed(match string, ids []string) [][2]string {
	out := make([][2]string, 0, len(ids))
	for _, id := range ids {
		out = append(out, [2]string{match, id})
	}
	return out
}
