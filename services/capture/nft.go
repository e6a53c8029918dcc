package capture

import (
	"sigs.k8s.io/knftables"
)

// The native nftables backend (#23): Istio's istio-iptables --native-nftables
// (tools/istio-nftables, Istio 1.27+) programs three inet tables of its own
// instead of iptables chains, one nft transaction for all of them. Names and
// hook priorities are Istio's, so that a node programmed by Istio's init
// container and one programmed by ours look the same to every tool.
const (
	NftNatTable    = "istio-proxy-nat"
	NftMangleTable = "istio-proxy-mangle"
	NftRawTable    = "istio-proxy-raw"

	nftPrerouting   = "prerouting"
	nftOutput       = "output"
	nftInbound      = "istio-inbound"
	nftOutputChain  = "istio-output"
	nftOutputDNS    = "istio-output-dns"
	nftRedirect     = "istio-redirect"
	nftInRedirect   = "istio-in-redirect"
	nftDivert       = "istio-divert"
	nftTProxy       = "istio-tproxy"
	nftDrop         = "istio-drop"
	nftCounter      = "counter"
	nftLoopback6    = "::1/128"
	nftPassthrough4 = "127.0.0.6/32"
	nftPassthrough6 = "::6/128"
)

// nftTables are our tables, in the order Istio's transaction touches them.
var nftTables = []string{NftNatTable, NftMangleTable, NftRawTable}

// nftChains are each table's chains in the order Istio declares them; only
// those that get a rule are created.
var nftChains = map[string][]knftables.Chain{
	NftNatTable: {
		baseChain(NftNatTable, nftPrerouting, knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority),
		baseChain(NftNatTable, nftOutput, knftables.NATType, knftables.OutputHook, knftables.DNATPriority),
		{Name: nftInbound}, {Name: nftRedirect}, {Name: nftInRedirect}, {Name: nftOutputChain}, {Name: nftOutputDNS},
	},
	NftMangleTable: {
		baseChain(NftMangleTable, nftPrerouting, knftables.FilterType, knftables.PreroutingHook, knftables.ManglePriority),
		// A route chain: a changed mark re-routes the packet (TPROXY's 1338).
		baseChain(NftMangleTable, nftOutput, knftables.RouteType, knftables.OutputHook, knftables.ManglePriority),
		{Name: nftDivert}, {Name: nftTProxy}, {Name: nftInbound}, {Name: nftDrop},
	},
	NftRawTable: {
		baseChain(NftRawTable, nftPrerouting, knftables.FilterType, knftables.PreroutingHook, knftables.RawPriority),
		baseChain(NftRawTable, nftOutput, knftables.FilterType, knftables.OutputHook, knftables.RawPriority),
		{Name: nftInbound}, {Name: nftOutputDNS},
	},
}

func baseChain(table, name string, typ knftables.BaseChainType, hook knftables.BaseChainHook, prio knftables.BaseChainPriority) knftables.Chain {
	return knftables.Chain{Name: name, Table: table, Family: knftables.InetFamily,
		Type: knftables.PtrTo(typ), Hook: knftables.PtrTo(hook), Priority: knftables.PtrTo(prio)}
}

// NftRuleSet is the complete nftables capture: each table's rules in build
// order. An insert is a rule with an Index (Istio's iptables position - 1).
type NftRuleSet struct {
	Rules map[string][]knftables.Rule
}

// nftBuilder accumulates rules; IPv6-only rules are dropped unless IPv6 is
// enabled (Istio's AppendV6RuleIfSupported), IPv4 ones always kept (an inet
// table carries both families).
type nftBuilder struct {
	rules map[string][]knftables.Rule
	ipv6  bool
}

func (b *nftBuilder) add(table, chain string, index *int, parts ...string) {
	b.rules[table] = append(b.rules[table], knftables.Rule{
		Family: knftables.InetFamily, Table: table, Chain: chain, Index: index, Rule: knftables.Concat(parts),
	})
}
func (b *nftBuilder) append(table, chain string, parts ...string) { b.add(table, chain, nil, parts...) }
func (b *nftBuilder) append6(table, chain string, parts ...string) {
	if b.ipv6 {
		b.add(table, chain, nil, parts...)
	}
}
func (b *nftBuilder) insert(table, chain string, pos int, parts ...string) {
	b.add(table, chain, knftables.PtrTo(pos), parts...)
}
func (b *nftBuilder) insert6(table, chain string, pos int, parts ...string) {
	if b.ipv6 {
		b.add(table, chain, knftables.PtrTo(pos), parts...)
	}
}

// BuildNft produces the rules istio-iptables --native-nftables
// (tools/istio-nftables/pkg/capture/run.go) produces for cfg, in the same
// order. The decisions are the iptables backend's (Build); the spelling and
// a few orders are nft's own (one inet table holds both families, so the
// IPv4 and IPv6 variants of a rule sit side by side). cfg should have passed
// Validate.
func BuildNft(cfg RulesConfig) NftRuleSet {
	b := &nftBuilder{rules: map[string][]knftables.Rule{}, ipv6: cfg.EnableIPv6}
	nat, mangle := NftNatTable, NftMangleTable
	tproxy := cfg.InboundInterceptionMode == "TPROXY"
	lo4 := cfg.HostIPv4LoopbackCidr
	exclude4, exclude6 := splitRanges(cfg.OutboundIPRangesExclude)
	include4, include6 := splitRanges(cfg.OutboundIPRangesInclude)
	redirectDNS := cfg.RedirectDNS && (cfg.CaptureAllDNS || len(cfg.DNSServersV4)+len(cfg.DNSServersV6) > 0)
	uids, gids := Split(cfg.ProxyUID), Split(cfg.ProxyGID)

	// 1. Interfaces never captured; kube-virt interfaces' inbound is not inbound.
	for _, nic := range Split(cfg.ExcludeInterfaces) {
		b.append(nat, nftPrerouting, "iifname", nic, nftCounter, "return")
		b.append(nat, nftOutput, "oifname", nic, nftCounter, "return")
	}
	if tproxy {
		for _, nic := range Split(cfg.ExcludeInterfaces) {
			b.append(mangle, nftPrerouting, "iifname", nic, nftCounter, "return")
			b.append(mangle, nftOutput, "oifname", nic, nftCounter, "return")
		}
	}
	for _, nic := range Split(cfg.RerouteVirtualInterfaces) {
		b.insert(nat, nftPrerouting, 0, "iifname", nic, nftCounter, "return")
	}
	// 2. Drop out-of-window packets rather than let them reset connections.
	if cfg.DropInvalid {
		b.append(mangle, nftPrerouting, "meta l4proto tcp", "ct state", "invalid", nftCounter, "jump", nftDrop)
		b.append(mangle, nftDrop, nftCounter, "drop")
	}
	// 3. The tunnel port is never captured; the two redirect chains.
	b.append(nat, nftInbound, "meta l4proto tcp", "tcp dport", cfg.InboundTunnelPort, nftCounter, "return")
	b.append(nat, nftRedirect, "meta l4proto tcp", nftCounter, "redirect to", ":"+cfg.ProxyPort)
	b.append(nat, nftInRedirect, "meta l4proto tcp", nftCounter, "redirect to", ":"+cfg.InboundCapturePort)
	// 4. Inbound.
	buildNftInbound(b, cfg, tproxy, lo4)
	// 5. All outbound traffic goes through istio-output; port exclusions first.
	b.append(nat, nftOutput, nftCounter, "jump", nftOutputChain)
	for _, port := range Split(cfg.OutboundPortsExclude) {
		b.append(nat, nftOutputChain, "tcp dport", port, nftCounter, "return")
		b.append(nat, nftOutputChain, "udp dport", port, nftCounter, "return")
	}
	// 6. Inbound passthrough connections (Envoy binds 127.0.0.6 / ::6).
	b.append(nat, nftOutputChain, "oifname", "lo", "ip saddr", nftPassthrough4, nftCounter, "return")
	b.append6(nat, nftOutputChain, "oifname", "lo", "ip6 saddr", nftPassthrough6, nftCounter, "return")
	// 7. The proxy's own traffic.
	loopbackIncluded := include4.loopback || include6.loopback
	for _, uid := range uids {
		nftOwnerRules(b, "skuid", uid, redirectDNS, redirectDNS, loopbackIncluded, cfg.InboundTunnelPort, lo4)
	}
	for _, gid := range gids {
		// As with iptables, a gid never gets the port-53 variant of the first rule.
		nftOwnerRules(b, "skgid", gid, false, redirectDNS, loopbackIncluded, cfg.InboundTunnelPort, lo4)
	}
	// 8. Owner groups.
	if groups, except := ownerGroupFilter(cfg); except {
		for _, g := range groups {
			b.append(nat, nftOutputChain, "skgid", g, nftCounter, "return")
		}
	} else {
		var parts []string
		for _, g := range groups {
			parts = append(parts, "skgid", "!=", g)
		}
		b.append(nat, nftOutputChain, append(parts, nftCounter, "return")...)
	}
	// 9. DNS.
	if redirectDNS {
		buildNftDNS(b, cfg, uids, gids)
	}
	// 10. Localhost and excluded ranges are never captured.
	b.append(nat, nftOutputChain, "ip daddr", lo4, nftCounter, "return")
	b.append6(nat, nftOutputChain, "ip6 daddr", nftLoopback6, nftCounter, "return")
	for _, p := range exclude4.cidrs {
		b.append(nat, nftOutputChain, "ip daddr", p.String(), nftCounter, "return")
	}
	for _, p := range exclude6.cidrs {
		b.append6(nat, nftOutputChain, "ip6 daddr", p.String(), nftCounter, "return")
	}
	// 11. Outbound ports always captured, then the captured ranges.
	for _, port := range Split(cfg.OutboundPortsInclude) {
		b.append(nat, nftOutputChain, "tcp dport", port, nftCounter, "jump", nftRedirect)
	}
	nics := Split(cfg.RerouteVirtualInterfaces)
	if include4.wildcard || include6.wildcard {
		b.append(nat, nftOutputChain, nftCounter, "jump", nftRedirect)
		for _, nic := range nics {
			b.insert(nat, nftPrerouting, 0, "iifname", nic, nftCounter, "jump", nftRedirect)
		}
	} else {
		for _, p := range include4.cidrs {
			for _, nic := range nics {
				b.insert(nat, nftPrerouting, 0, "iifname", nic, "ip daddr", p.String(), nftCounter, "jump", nftRedirect)
			}
			b.append(nat, nftOutputChain, "ip daddr", p.String(), nftCounter, "jump", nftRedirect)
		}
		for _, p := range include6.cidrs {
			for _, nic := range nics {
				b.insert6(nat, nftPrerouting, 0, "iifname", nic, "ip6 daddr", p.String(), nftCounter, "jump", nftRedirect)
			}
			b.append6(nat, nftOutputChain, "ip6 daddr", p.String(), nftCounter, "jump", nftRedirect)
		}
	}
	// 12. TPROXY marks and loop prevention.
	if tproxy {
		buildNftTProxyMarks(b, cfg, uids, gids, lo4)
	}
	return NftRuleSet{Rules: b.rules}
}

func buildNftInbound(b *nftBuilder, cfg RulesConfig, tproxy bool, lo4 string) {
	if cfg.InboundPortsInclude == "" {
		return
	}
	table, target := NftNatTable, nftInRedirect
	if tproxy {
		table = NftMangleTable
		mark := cfg.InboundTProxyMark
		b.append(table, nftDivert, nftCounter, "meta mark set", mark)
		b.append(table, nftDivert, nftCounter, "accept")
		b.append(table, nftTProxy, "meta l4proto tcp", "ip daddr", "!=", lo4,
			"tproxy ip to", ":"+cfg.InboundCapturePort, "meta mark set", mark, nftCounter, "accept")
		b.append6(table, nftTProxy, "meta l4proto tcp", "ip6 daddr", "!=", nftLoopback6,
			"tproxy ip6 to", ":"+cfg.InboundCapturePort, "meta mark set", mark, nftCounter, "accept")
	}
	b.append(table, nftPrerouting, "meta l4proto tcp", nftCounter, "jump", nftInbound)
	if cfg.InboundPortsInclude == "*" {
		for _, port := range Split(cfg.InboundPortsExclude) {
			b.append(table, nftInbound, "meta l4proto tcp", "tcp dport", port, nftCounter, "return")
		}
		if tproxy {
			b.append(table, nftInbound, "meta l4proto tcp", "ct state", "related,established", nftCounter, "jump", nftDivert)
			b.append(table, nftInbound, "meta l4proto tcp", nftCounter, "jump", nftTProxy)
		} else {
			b.append(table, nftInbound, "meta l4proto tcp", nftCounter, "jump", target)
		}
		return
	}
	for _, port := range Split(cfg.InboundPortsInclude) {
		if tproxy {
			b.append(table, nftInbound, "meta l4proto tcp", "ct state", "related,established", "tcp dport", port, nftCounter, "jump", nftDivert)
			b.append(table, nftInbound, "meta l4proto tcp", "tcp dport", port, nftCounter, "jump", nftTProxy)
		} else {
			b.append(table, nftInbound, "meta l4proto tcp", "tcp dport", port, nftCounter, "jump", target)
		}
	}
}

// nftOwnerRules are the three rules for one proxy uid or gid (see
// ownerRules): loop app calls via a VIP back to inbound, skip others'
// loopback traffic, never capture the proxy itself.
func nftOwnerRules(b *nftBuilder, match, id string, dnsFirst, dnsSecond, loopbackIncluded bool, tunnelPort, lo4 string) {
	ports := tunnelPort
	if dnsFirst {
		ports = "{ 53, " + tunnelPort + " }"
	}
	b.append(NftNatTable, nftOutputChain, "oifname", "lo", "meta l4proto tcp", "ip daddr", "!=", lo4,
		"tcp dport", "!=", ports, match, id, nftCounter, "jump", nftInRedirect)
	b.append6(NftNatTable, nftOutputChain, "oifname", "lo", "meta l4proto tcp", "ip6 daddr", "!=", nftLoopback6,
		"tcp dport", "!=", ports, match, id, nftCounter, "jump", nftInRedirect)
	if !loopbackIncluded {
		if dnsSecond {
			b.append(NftNatTable, nftOutputChain, "oifname", "lo", "meta l4proto tcp", "tcp dport", "!=", "53",
				match, "!=", id, nftCounter, "return")
		} else {
			b.append(NftNatTable, nftOutputChain, "oifname", "lo", match, "!=", id, nftCounter, "return")
		}
	}
	b.append(NftNatTable, nftOutputChain, match, id, nftCounter, "return")
}

func buildNftDNS(b *nftBuilder, cfg RulesConfig, uids, gids []string) {
	nat, raw := NftNatTable, NftRawTable
	all := cfg.CaptureAllDNS
	redirect := []string{nftCounter, "redirect", "to", ":" + DNSListenerPort}
	b.append(raw, nftOutput, nftCounter, "jump", nftOutputDNS)
	b.append(nat, nftOutputChain, nftCounter, "jump", nftOutputDNS)
	if all {
		b.append(nat, nftOutputDNS, append([]string{"meta l4proto tcp", "tcp dport", "53"}, redirect...)...)
		b.append(nat, nftOutputDNS, append([]string{"udp dport", "53"}, redirect...)...)
	} else {
		for _, proto := range []string{"tcp", "udp"} {
			for _, s := range cfg.DNSServersV4 {
				b.append(nat, nftOutputDNS, append([]string{"ip daddr", s + "/32", proto + " dport", "53"}, redirect...)...)
			}
			for _, s := range cfg.DNSServersV6 {
				b.append6(nat, nftOutputDNS, append([]string{"ip6 daddr", s + "/128", proto + " dport", "53"}, redirect...)...)
			}
		}
	}
	// Conntrack zones: proxy<->upstream in zone 1, app<->proxy in zone 2, so
	// the two legs of a redirected UDP query never collide.
	for _, o := range append(prefixed("skuid", uids), prefixed("skgid", gids)...) {
		b.append(raw, nftOutputDNS, "udp dport", "53", "meta", o[0], o[1], nftCounter, "ct", "zone", "set", "1")
		b.append(raw, nftOutputDNS, "udp sport", DNSListenerPort, "meta", o[0], o[1], nftCounter, "ct", "zone", "set", "2")
	}
	if all {
		b.append(raw, nftPrerouting, nftCounter, "jump", nftInbound)
		b.append(raw, nftOutputDNS, "udp dport", "53", nftCounter, "ct", "zone", "set", "2")
		b.append(raw, nftInbound, "udp sport", "53", nftCounter, "ct", "zone", "set", "1")
		return
	}
	b.append(raw, nftPrerouting, nftCounter, "jump", nftInbound)
	for _, s := range cfg.DNSServersV4 {
		b.append(raw, nftOutputDNS, "udp dport", "53", "ip daddr", s+"/32", nftCounter, "ct", "zone", "set", "2")
		b.append(raw, nftInbound, "udp sport", "53", "ip saddr", s+"/32", nftCounter, "ct", "zone", "set", "1")
	}
	for _, s := range cfg.DNSServersV6 {
		b.append6(raw, nftOutputDNS, "udp dport", "53", "ip6 daddr", s+"/128", nftCounter, "ct", "zone", "set", "2")
		b.append6(raw, nftInbound, "udp sport", "53", "ip6 saddr", s+"/128", nftCounter, "ct", "zone", "set", "1")
	}
}

func buildNftTProxyMarks(b *nftBuilder, cfg RulesConfig, uids, gids []string, lo4 string) {
	mangle, mark := NftMangleTable, cfg.InboundTProxyMark
	// Save the mark Envoy's original_src listener filter set as the connection's.
	b.append(mangle, nftPrerouting, "meta l4proto tcp", "mark", mark, nftCounter, "ct mark set mark")
	b.append(mangle, nftOutput, "oifname", "lo", "meta l4proto tcp", "mark", mark, nftCounter, "return")
	for _, o := range append(prefixed("skuid", uids), prefixed("skgid", gids)...) {
		// Envoy outbound -> Envoy inbound via the pod IP is marked 1338 so
		// that inbound capture does not take it again.
		b.append(mangle, nftOutput, "oifname", "lo", "meta l4proto tcp", "ip daddr", "!=", lo4,
			o[0], o[1], nftCounter, "meta mark set", OutboundMark)
		b.append6(mangle, nftOutput, "oifname", "lo", "meta l4proto tcp", "ip6 daddr", "!=", nftLoopback6,
			o[0], o[1], nftCounter, "meta mark set", OutboundMark)
	}
	b.append(mangle, nftOutput, "meta l4proto tcp", "ct", "mark", mark, nftCounter, "meta mark set", "ct", "mark")
	b.insert(mangle, nftInbound, 0, "meta l4proto tcp", "mark", mark, nftCounter, "return")
	b.insert(mangle, nftInbound, 1, "iifname", "lo", "meta l4proto tcp", "ip saddr", nftPassthrough4, nftCounter, "return")
	b.insert6(mangle, nftInbound, 1, "iifname", "lo", "meta l4proto tcp", "ip6 saddr", nftPassthrough6, nftCounter, "return")
	b.insert(mangle, nftInbound, 2, "iifname", "lo", "meta l4proto tcp", "mark", "!=", OutboundMark, nftCounter, "return")
}

// addTo queues the rule set on tx as Istio's transaction does, table by
// table: ensure the table, flush it, declare the chains that have rules,
// then the rules. An insert whose position does not exist yet (an empty
// chain, or past its end) becomes an append, as in Istio: nft refuses an
// index it cannot find, where iptables -I 1 works on an empty chain.
// A table without rules is left alone.
func (rs NftRuleSet) addTo(tx *knftables.Transaction) {
	for _, table := range nftTables {
		rules := rs.Rules[table]
		if len(rules) == 0 {
			continue
		}
		count := map[string]int{}
		for _, r := range rules {
			count[r.Chain]++
		}
		t := &knftables.Table{Family: knftables.InetFamily, Name: table}
		tx.Add(t)
		tx.Flush(t)
		for _, c := range nftChains[table] {
			if count[c.Name] > 0 {
				c.Table, c.Family = table, knftables.InetFamily
				tx.Add(&c)
			}
		}
		clear(count)
		for _, r := range rules {
			if r.Index != nil && *r.Index >= count[r.Chain] {
				r.Index = nil
			}
			if r.Index != nil {
				tx.Insert(&r)
			} else {
				tx.Add(&r)
			}
			count[r.Chain]++
		}
	}
}

// nftRemoveAll queues the removal of our three tables, whether or not they
// exist: "add" then "delete" in one transaction (Istio's cleanup), as old
// nft has no "destroy". Nothing outside our tables is touched.
func nftRemoveAll(tx *knftables.Transaction) {
	for _, table := range nftTables {
		t := &knftables.Table{Family: knftables.InetFamily, Name: table}
		tx.Add(t)
		tx.Delete(t)
	}
}

// NftRemovalText is nftRemoveAll as nft -f input (a dry-run cleanup).
func NftRemovalText() string {
	tx := knftables.NewFake("", "").NewTransaction()
	nftRemoveAll(tx)
	return tx.String()
}

// Text is the rule set as nft -f input: exactly what Istio's nftables
// backend runs and logs (its golden files).
func (rs NftRuleSet) Text() string {
	tx := knftables.NewFake("", "").NewTransaction()
	rs.addTo(tx)
	return tx.String()
}

// tables lists the names of the tables a rule set programs.
func (rs NftRuleSet) tables() []string {
	var out []string
	for _, t := range nftTables {
		if len(rs.Rules[t]) > 0 {
			out = append(out, t)
		}
	}
	return out
}
