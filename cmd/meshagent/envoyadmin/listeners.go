package envoyadmin

// The listener table of proxy-config (issue 22): one row per filter chain,
// described as istioctl describes it.

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/types/known/anypb"
)

// ListenerFilter keeps the listeners on Address (any of its addresses) and
// Port, when set.
type ListenerFilter struct {
	Address string
	Port    int
}

// ListenerTable is `proxy-config listener`: one row per filter chain (what it
// matches, where it sends), listeners sorted by port then address.
func (d *Dump) ListenerTable(f ListenerFilter) Table {
	ld := d.Listeners()
	listeners := append(unpackEach[*listenerv3.Listener](ld.GetDynamicListeners(), func(l *adminv3.ListenersConfigDump_DynamicListener) *anypb.Any {
		return l.GetActiveState().GetListener()
	}), unpackEach[*listenerv3.Listener](ld.GetStaticListeners(), (*adminv3.ListenersConfigDump_StaticListener).GetListener)...)
	listeners = slices.DeleteFunc(listeners, func(l *listenerv3.Listener) bool {
		return (f.Port != 0 && listenerPort(l) != f.Port) || (f.Address != "" && !slices.Contains(listenerAddresses(l), f.Address))
	})
	slices.SortStableFunc(listeners, func(a, b *listenerv3.Listener) int {
		return cmp.Or(cmp.Compare(listenerPort(a), listenerPort(b)),
			cmp.Compare(strings.Join(listenerAddresses(a), ","), strings.Join(listenerAddresses(b), ",")))
	})
	t := Table{Header: []string{"ADDRESSES", "PORT", "MATCH", "DESTINATION"}}
	for _, l := range listeners {
		addrs, port := strings.Join(listenerAddresses(l), ","), strconv.Itoa(listenerPort(l))
		for _, fc := range chains(l) {
			t.Rows = append(t.Rows, []string{addrs, port, describeChainMatch(fc.GetFilterChainMatch()), destination(fc.GetFilters())})
		}
		if api := l.GetApiListener().GetApiListener(); api != nil {
			// A proxyless gRPC client's listener: no chain, one connection manager.
			t.Rows = append(t.Rows, []string{addrs, port, "ALL", describeHCM(unpack[*hcmv3.HttpConnectionManager](api))})
		}
		t.Resources = append(t.Resources, l)
	}
	return t
}

func listenerAddresses(l *listenerv3.Listener) []string {
	var out []string
	if a := l.GetAddress().GetSocketAddress().GetAddress(); a != "" {
		out = append(out, a)
	}
	for _, extra := range l.GetAdditionalAddresses() {
		if a := extra.GetAddress().GetSocketAddress().GetAddress(); a != "" {
			out = append(out, a)
		}
	}
	return out
}

func listenerPort(l *listenerv3.Listener) int {
	return int(l.GetAddress().GetSocketAddress().GetPortValue())
}

// chains are the listener's filter chains, its default chain last.
func chains(l *listenerv3.Listener) []*listenerv3.FilterChain {
	out := slices.Clone(l.GetFilterChains())
	if l.GetDefaultFilterChain() != nil {
		out = append(out, l.GetDefaultFilterChain())
	}
	return out
}

// Istio's ALPN sets, named as istioctl names them.
var alpnNames = []struct {
	name  string
	alpns []string
}{
	{"App: HTTP TLS", []string{"http/1.0", "http/1.1", "h2c", "istio-http/1.0", "istio-http/1.1", "istio-h2"}},
	{"App: Istio HTTP Plain", []string{"istio", "istio-http/1.0", "istio-http/1.1", "istio-h2"}},
	{"App: TCP TLS", []string{"istio-peer-exchange", "istio"}},
	{"App: HTTP", []string{"http/1.0", "http/1.1", "h2c"}},
}

// describeChainMatch is a chain's match: SNI, transport, ALPN, addresses,
// or ALL.
func describeChainMatch(m *listenerv3.FilterChainMatch) string {
	var parts []string
	if names := m.GetServerNames(); len(names) > 0 {
		parts = append(parts, "SNI: "+strings.Join(names, ","))
	}
	if tp := m.GetTransportProtocol(); tp != "" {
		parts = append(parts, "Trans: "+tp)
	}
	if alpns := m.GetApplicationProtocols(); len(alpns) > 0 {
		desc := "App: " + strings.Join(alpns, ",")
		for _, n := range alpnNames {
			if slices.Equal(alpns, n.alpns) {
				desc = n.name
				break
			}
		}
		parts = append(parts, desc)
	}
	port := ""
	if m.GetDestinationPort() != nil {
		port = ":" + strconv.Itoa(int(m.GetDestinationPort().GetValue()))
	}
	if ranges := m.GetPrefixRanges(); len(ranges) > 0 {
		var prefixes []string
		for _, r := range ranges {
			prefixes = append(prefixes, fmt.Sprintf("%s/%d", r.GetAddressPrefix(), r.GetPrefixLen().GetValue()))
		}
		parts = append(parts, "Addr: "+strings.Join(prefixes, ",")+port)
	} else if port != "" {
		parts = append(parts, "Addr: *"+port)
	}
	if len(parts) == 0 {
		return "ALL"
	}
	return strings.Join(parts, "; ")
}

// destination is where a chain sends: its route (HTTP) or cluster (TCP).
func destination(filters []*listenerv3.Filter) string {
	for _, f := range filters {
		switch f.GetName() {
		case wellknown.HTTPConnectionManager:
			return describeHCM(unpack[*hcmv3.HttpConnectionManager](f.GetTypedConfig()))
		case wellknown.TCPProxy:
			tcp := unpack[*tcpv3.TcpProxy](f.GetTypedConfig())
			if tcp == nil || tcp.GetCluster() == blackHoleCluster {
				continue // Istio shows a black hole chain as not forwarding
			}
			return clusterRef(tcp.GetCluster())
		}
	}
	return "Non-HTTP/Non-TCP"
}

func describeHCM(h *hcmv3.HttpConnectionManager) string {
	switch {
	case h == nil:
		return "HTTP"
	case h.GetRouteConfig() != nil:
		return describeInlineRoutes(h.GetRouteConfig())
	case h.GetRds().GetRouteConfigName() != "":
		return "Route: " + h.GetRds().GetRouteConfigName()
	}
	return "HTTP"
}

// clusterRef names a cluster in a DESTINATION: Istio's passthrough and
// black hole as themselves, others as "Cluster: NAME".
func clusterRef(name string) string {
	if strings.Contains(name, "Cluster") {
		return name
	}
	return "Cluster: " + name
}

// describeInlineRoutes is a route table inside a listener: the one cluster
// a catch-all sends to, else its virtual hosts' domains and matches.
func describeInlineRoutes(rc *routev3.RouteConfiguration) string {
	if vhs := rc.GetVirtualHosts(); len(vhs) == 1 && slices.Equal(vhs[0].GetDomains(), []string{"*"}) &&
		len(vhs[0].GetRoutes()) == 1 && vhs[0].GetRoutes()[0].GetMatch().GetPrefix() == "/" {
		if c := vhs[0].GetRoutes()[0].GetRoute().GetCluster(); c != "" {
			return clusterRef(c)
		}
	}
	var vhosts []string
	for _, vh := range rc.GetVirtualHosts() {
		var matches []string
		for _, r := range vh.GetRoutes() {
			matches = append(matches, describeRouteMatch(r.GetMatch()))
		}
		desc := strings.Join(matches, ", ")
		if d := vh.GetDomains(); !(len(d) == 1 && d[0] == "*") {
			desc = strings.Join(d, "/") + " " + desc
		}
		vhosts = append(vhosts, desc)
	}
	return "Inline Route: " + strings.Join(vhosts, "; ")
}
