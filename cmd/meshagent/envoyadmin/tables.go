package envoyadmin

// The tables of `istioctl proxy-config cluster|listener|route|endpoint|
// secret`, read from the dump (issue 22). The columns, the way a name is
// split and a filter chain described are Istio's (istioctl/pkg/writer/
// envoy/configdump) so that an operator reads the same table inside the pod
// as from istioctl; the code is ours.

import (
	"cmp"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Table is one proxy-config table: its header, its rows, and the resources
// the rows were read from (what -o json|yaml prints).
type Table struct {
	Header    []string
	Rows      [][]string
	Resources []proto.Message
}

// Istio's passthrough and black hole clusters, named as themselves (not
// "Cluster: ...") in a DESTINATION.
const (
	passthroughCluster = "PassthroughCluster"
	blackHoleCluster   = "BlackHoleCluster"
)

// unpack is the message an Any holds, nil when it cannot be read.
func unpack[T proto.Message](a *anypb.Any) T {
	var zero T
	if a == nil {
		return zero
	}
	m, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: Resolver})
	if t, ok := m.(T); err == nil && ok {
		return t
	}
	return zero
}

// ClusterFilter keeps the clusters whose name holds each set field, as
// istioctl's does: FQDN, direction and subset as substrings, the port as
// "|port|".
type ClusterFilter struct {
	FQDN, Direction, Subset string
	Port                    int
}

func (f ClusterFilter) keeps(name string) bool {
	return strings.Contains(name, f.FQDN) && strings.Contains(name, f.Direction) && strings.Contains(name, f.Subset) &&
		(f.Port == 0 || strings.Contains(name, "|"+strconv.Itoa(f.Port)+"|"))
}

// clusterKey is an Istio cluster name split ("outbound|9080|v1|reviews.
// default.svc.cluster.local"); a name of another form is its FQDN alone.
type clusterKey struct {
	direction, subset, fqdn string
	port                    int
	istio                   bool
}

func splitClusterName(name string) clusterKey {
	parts := strings.Split(name, "|")
	if len(parts) != 4 {
		return clusterKey{fqdn: name}
	}
	port, _ := strconv.Atoi(parts[1])
	return clusterKey{direction: parts[0], port: port, subset: parts[2], fqdn: parts[3], istio: true}
}

// ClusterTable is `proxy-config cluster`: dynamic then static clusters, sorted
// by FQDN, subset, port, direction.
func (d *Dump) ClusterTable(f ClusterFilter) Table {
	var clusters []*clusterv3.Cluster
	cd := d.Clusters()
	for _, c := range cd.GetDynamicActiveClusters() {
		if c := unpack[*clusterv3.Cluster](c.GetCluster()); c != nil {
			clusters = append(clusters, c)
		}
	}
	for _, c := range cd.GetStaticClusters() {
		if c := unpack[*clusterv3.Cluster](c.GetCluster()); c != nil {
			clusters = append(clusters, c)
		}
	}
	clusters = slices.DeleteFunc(clusters, func(c *clusterv3.Cluster) bool { return !f.keeps(c.GetName()) })
	slices.SortStableFunc(clusters, func(a, b *clusterv3.Cluster) int {
		ka, kb := splitClusterName(a.GetName()), splitClusterName(b.GetName())
		return cmp.Or(cmp.Compare(ka.fqdn, kb.fqdn), cmp.Compare(ka.subset, kb.subset),
			cmp.Compare(ka.port, kb.port), cmp.Compare(ka.direction, kb.direction))
	})
	t := Table{Header: []string{"SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE"}}
	for _, c := range clusters {
		k := splitClusterName(c.GetName())
		row := []string{k.fqdn, "-", "-", "-", clusterType(c), istioConfig(c.GetMetadata())}
		if k.istio {
			row[1], row[3] = strconv.Itoa(k.port), k.direction
			if k.subset != "" {
				row[2] = k.subset
			}
		}
		t.Rows = append(t.Rows, row)
		t.Resources = append(t.Resources, c)
	}
	return t
}

// clusterType is the cluster's discovery type, or its custom type's name.
func clusterType(c *clusterv3.Cluster) string {
	if ct := c.GetClusterType(); ct != nil {
		return ct.GetName()
	}
	return c.GetType().String()
}

// istioConfig is the Istio resource that made a cluster or route (its
// metadata's istio.config, "/apis/networking.istio.io/v1alpha3/namespaces/
// NS/destination-rule/NAME") as NAME.NS; "" when none did.
func istioConfig(md *corev3.Metadata) string {
	path := md.GetFilterMetadata()["istio"].GetFields()["config"].GetStringValue()
	if path == "" {
		return ""
	}
	if p := strings.Split(path, "/"); len(p) == 8 && strings.HasPrefix(path, "/apis/networking.istio.io/") {
		return p[7] + "." + p[5]
	}
	return "<unknown>"
}

// ListenerFilter keeps the listeners on Address (any of its addresses) and
// Port, when set.
type ListenerFilter struct {
	Address string
	Port    int
}

// ListenerTable is `proxy-config listener`: one row per filter chain (what it
// matches, where it sends), listeners sorted by port then address.
func (d *Dump) ListenerTable(f ListenerFilter) Table {
	var listeners []*listenerv3.Listener
	ld := d.Listeners()
	for _, l := range ld.GetDynamicListeners() {
		if l := unpack[*listenerv3.Listener](l.GetActiveState().GetListener()); l != nil {
			listeners = append(listeners, l)
		}
	}
	for _, l := range ld.GetStaticListeners() {
		if l := unpack[*listenerv3.Listener](l.GetListener()); l != nil {
			listeners = append(listeners, l)
		}
	}
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

func describeRouteMatch(m *routev3.RouteMatch) string {
	var conds []string
	if p := m.GetPrefix(); p != "" {
		conds = append(conds, p+"*")
	}
	if p := m.GetPath(); p != "" {
		conds = append(conds, p)
	}
	if re := m.GetSafeRegex(); re != nil {
		conds = append(conds, "regex "+re.GetRegex())
	}
	return strings.Join(conds, " ")
}

// RouteFilter keeps the route configuration Name, when set.
type RouteFilter struct{ Name string }

// RouteTable is `proxy-config route`: one row per route of each virtual host
// (a virtual host without routes is one "/*" row answering 404), the
// passthrough routes left out as Istio does; route tables sorted by name,
// port numbers first and in numeric order.
func (d *Dump) RouteTable(f RouteFilter) Table {
	var rcs []*routev3.RouteConfiguration
	rd := d.Routes()
	for _, r := range rd.GetDynamicRouteConfigs() {
		if rc := unpack[*routev3.RouteConfiguration](r.GetRouteConfig()); rc != nil {
			rcs = append(rcs, rc)
		}
	}
	for _, r := range rd.GetStaticRouteConfigs() {
		if rc := unpack[*routev3.RouteConfiguration](r.GetRouteConfig()); rc != nil {
			rcs = append(rcs, rc)
		}
	}
	rcs = slices.DeleteFunc(rcs, func(rc *routev3.RouteConfiguration) bool { return f.Name != "" && rc.GetName() != f.Name })
	slices.SortStableFunc(rcs, func(a, b *routev3.RouteConfiguration) int {
		na, errA := strconv.Atoi(a.GetName())
		nb, errB := strconv.Atoi(b.GetName())
		switch {
		case errA == nil && errB == nil:
			return cmp.Compare(na, nb)
		case errA == nil:
			return -1
		case errB == nil:
			return 1
		}
		return cmp.Compare(a.GetName(), b.GetName())
	})
	t := Table{Header: []string{"NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE"}}
	for _, rc := range rcs {
		for _, vh := range rc.GetVirtualHosts() {
			domains := describeDomains(vh.GetDomains())
			for _, r := range vh.GetRoutes() {
				if r.GetRoute().GetCluster() == passthroughCluster {
					continue
				}
				t.Rows = append(t.Rows, []string{rc.GetName(), vh.GetName(), domains, describeRouteMatch(r.GetMatch()), istioConfig(r.GetMetadata())})
			}
			if len(vh.GetRoutes()) == 0 {
				t.Rows = append(t.Rows, []string{rc.GetName(), vh.GetName(), domains, "/*", "404"})
			}
		}
		t.Resources = append(t.Resources, rc)
	}
	return t
}

// describeDomains is a virtual host's domains as istioctl shows them: the
// names without a port, a name dropped when its short form is there too
// (reviews.default.svc.cluster.local beside reviews.default), at most two
// and a count of the rest.
func describeDomains(domains []string) string {
	if len(domains) <= 1 {
		return strings.Join(domains, "")
	}
	var bare []string
	for _, d := range domains {
		// host:port is left out; an IPv6 literal ([fd00::1]) is not a port.
		if !strings.Contains(d, ":") || (strings.Count(d, ":") > 2 && strings.HasSuffix(d, "]")) {
			bare = append(bare, d)
		}
	}
	var kept []string
	for _, d := range bare {
		short := []string{strings.TrimSuffix(d, ".svc.cluster.local"), strings.TrimSuffix(d, ".svc")}
		if !slices.ContainsFunc(short, func(s string) bool { return s != d && slices.Contains(bare, s) }) {
			kept = append(kept, d)
		}
	}
	if len(kept) > 2 {
		return fmt.Sprintf("%s + %d more...", strings.Join(kept[:2], ", "), len(kept)-2)
	}
	return strings.Join(kept, ", ")
}

// EndpointFilter keeps the endpoints of Cluster, on Address and Port, in
// Status, when set.
type EndpointFilter struct {
	Address, Cluster, Status string
	Port                     int
}

// EndpointTable is `proxy-config endpoint` (the dump must have been asked
// with ?include_eds): one row per endpoint, sorted by cluster then address.
// A config dump has no outlier detection state: OUTLIER CHECK is OK.
func (d *Dump) EndpointTable(f EndpointFilter) Table {
	var clas []*endpointv3.ClusterLoadAssignment
	ed := d.Endpoints()
	for _, e := range ed.GetDynamicEndpointConfigs() {
		if cla := unpack[*endpointv3.ClusterLoadAssignment](e.GetEndpointConfig()); cla != nil {
			clas = append(clas, cla)
		}
	}
	for _, e := range ed.GetStaticEndpointConfigs() {
		if cla := unpack[*endpointv3.ClusterLoadAssignment](e.GetEndpointConfig()); cla != nil {
			clas = append(clas, cla)
		}
	}
	slices.SortStableFunc(clas, func(a, b *endpointv3.ClusterLoadAssignment) int {
		return cmp.Compare(a.GetClusterName(), b.GetClusterName())
	})
	t := Table{Header: []string{"ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"}}
	for _, cla := range clas {
		if f.Cluster != "" && cla.GetClusterName() != f.Cluster {
			continue
		}
		var rows [][]string
		for _, locality := range cla.GetEndpoints() {
			for _, lb := range locality.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				addr := lb.GetEndpoint().GetAddress().GetPipe().GetPath()
				if sa != nil {
					addr = fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())
				}
				status := lb.GetHealthStatus()
				if status == corev3.HealthStatus_UNKNOWN {
					status = corev3.HealthStatus_HEALTHY // Envoy routes to an endpoint of unknown health
				}
				if (f.Address != "" && sa.GetAddress() != f.Address) || (f.Port != 0 && int(sa.GetPortValue()) != f.Port) ||
					(f.Status != "" && !strings.EqualFold(status.String(), f.Status)) {
					continue
				}
				rows = append(rows, []string{addr, status.String(), "OK", cla.GetClusterName()})
			}
		}
		slices.SortStableFunc(rows, func(a, b []string) int { return cmp.Compare(a[0], b[0]) })
		t.Rows = append(t.Rows, rows...)
		if len(rows) > 0 {
			t.Resources = append(t.Resources, cla)
		}
	}
	return t
}

// SecretTable is `proxy-config secret`: the active, then warming, then static
// secrets; for a certificate or a CA bundle the first certificate's
// serial and validity, and whether it is valid at now.
func (d *Dump) SecretTable(now time.Time) Table {
	t := Table{Header: []string{"RESOURCE NAME", "TYPE", "STATUS", "VALID CERT", "SERIAL NUMBER", "NOT AFTER", "NOT BEFORE"}}
	sd := d.Secrets()
	add := func(name, status string, a *anypb.Any, entry proto.Message) {
		s := unpack[*tlsv3.Secret](a)
		kind, pemBytes := "", []byte(nil)
		switch {
		case s.GetTlsCertificate() != nil:
			kind, pemBytes = "Cert Chain", dataSource(s.GetTlsCertificate().GetCertificateChain())
		case s.GetValidationContext() != nil:
			kind, pemBytes = "CA", dataSource(s.GetValidationContext().GetTrustedCa())
		}
		row := []string{name, kind, status, "false", "", "", ""}
		if c := firstCertificate(pemBytes); c != nil {
			row[3] = strconv.FormatBool(!now.Before(c.NotBefore) && !now.After(c.NotAfter))
			row[4] = c.SerialNumber.Text(16)
			row[5], row[6] = c.NotAfter.UTC().Format(time.RFC3339), c.NotBefore.UTC().Format(time.RFC3339)
		}
		t.Rows = append(t.Rows, row)
		t.Resources = append(t.Resources, entry)
	}
	for _, s := range sd.GetDynamicActiveSecrets() {
		add(s.GetName(), "ACTIVE", s.GetSecret(), s)
	}
	for _, s := range sd.GetDynamicWarmingSecrets() {
		add(s.GetName(), "WARMING", s.GetSecret(), s)
	}
	for _, s := range sd.GetStaticSecrets() {
		add(s.GetName(), "ACTIVE", s.GetSecret(), s)
	}
	return t
}

// dataSource is the inline bytes of a data source (a real Envoy dumps a
// file-backed one by its path only).
func dataSource(ds *corev3.DataSource) []byte {
	if b := ds.GetInlineBytes(); b != nil {
		return b
	}
	return []byte(ds.GetInlineString())
}

func firstCertificate(pemBytes []byte) *x509.Certificate {
	for {
		var block *pem.Block
		block, pemBytes = pem.Decode(pemBytes)
		if block == nil {
			return nil
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil
		}
		return c
	}
}
