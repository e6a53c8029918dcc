package envoyadmin

import (
	"slices"
	"strings"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// The tables read what a sidecar's dump holds as istioctl shows it (issue
// 22): Istio's cluster names split, a DestinationRule named from the
// metadata, a chain per listener row, a route per row with the passthrough
// left out and an empty virtual host a 404, endpoints of unknown health
// HEALTHY, and a certificate's serial and validity.
func TestTablesReadTheDumpAsIstioctlShowsIt(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	leaf, _ := pki.NewRoot(t, "test").Leaf(t, pki.Leaf{SPIFFE: pki.WorkloadID, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)})
	serial := pki.ParseLeaf(t, leaf).SerialNumber.Text(16) // istioctl prints it in hex
	d := roundTrip(t, sidecarDump(t, leaf))

	check := func(name string, got Table, want [][]string) {
		t.Helper()
		if !slices.EqualFunc(got.Rows, want, slices.Equal) {
			t.Errorf("%s rows:\n%s\nwant:\n%s", name, rows(got.Rows), rows(want))
		}
	}
	check("clusters", d.ClusterTable(ClusterFilter{}), [][]string{
		{"PassthroughCluster", "-", "-", "-", "ORIGINAL_DST", ""},
		{"reviews.default.svc.cluster.local", "9080", "-", "outbound", "EDS", "reviews.default"},
		{"reviews.default.svc.cluster.local", "9080", "v1", "outbound", "EDS", "reviews.default"},
		{"xds-grpc", "-", "-", "-", "STATIC", ""},
	})
	check("clusters --subset v1", d.ClusterTable(ClusterFilter{Subset: "v1"}), [][]string{
		{"reviews.default.svc.cluster.local", "9080", "v1", "outbound", "EDS", "reviews.default"},
	})
	check("clusters --port 9080 --direction inbound", d.ClusterTable(ClusterFilter{Port: 9080, Direction: "inbound"}), nil)
	check("listeners", d.ListenerTable(ListenerFilter{}), [][]string{
		{"0.0.0.0", "9080", "ALL", "Route: 9080"},
		{"10.96.0.20", "9090", "Addr: 10.96.0.20/32:9090", "Cluster: outbound|9090||db.default.svc.cluster.local"},
		{"0.0.0.0", "15001", "Addr: *:15001", "Non-HTTP/Non-TCP"},
		{"0.0.0.0", "15001", "ALL", "PassthroughCluster"},
	})
	check("listeners --port 9090", d.ListenerTable(ListenerFilter{Port: 9090}), [][]string{
		{"10.96.0.20", "9090", "Addr: 10.96.0.20/32:9090", "Cluster: outbound|9090||db.default.svc.cluster.local"},
	})
	check("routes", d.RouteTable(RouteFilter{}), [][]string{
		{"9080", "reviews.default.svc.cluster.local:9080", "reviews, reviews.default + 1 more...", "/*", "reviews.default"},
		{"9080", "empty:9080", "empty", "/*", "404"},
	})
	check("endpoints", d.EndpointTable(EndpointFilter{}), [][]string{
		{"10.0.0.1:9080", "HEALTHY", "OK", "outbound|9080||reviews.default.svc.cluster.local"},
		{"10.0.0.2:9080", "UNHEALTHY", "OK", "outbound|9080||reviews.default.svc.cluster.local"},
	})
	check("endpoints --status healthy", d.EndpointTable(EndpointFilter{Status: "healthy"}), [][]string{
		{"10.0.0.1:9080", "HEALTHY", "OK", "outbound|9080||reviews.default.svc.cluster.local"},
	})
	check("secrets", d.SecretTable(now), [][]string{
		{"default", "Cert Chain", "ACTIVE", "true", serial, "2026-11-26T13:00:00Z", "2026-11-26T11:00:00Z"},
		{"ROOTCA", "CA", "WARMING", "false", "", "", ""},
	})
	if s := d.SecretTable(now.Add(2 * time.Hour)); s.Rows[0][3] != "false" {
		t.Errorf("an expired certificate is VALID CERT %s", s.Rows[0][3])
	}
	if got := d.ClusterTable(ClusterFilter{FQDN: "reviews"}); len(got.Resources) != 2 ||
		got.Resources[1].(*clusterv3.Cluster).GetName() != "outbound|9080|v1|reviews.default.svc.cluster.local" {
		t.Errorf("--fqdn reviews resources: %v", got.Resources)
	}
}

func rows(r [][]string) string {
	var b strings.Builder
	for _, row := range r {
		b.WriteString(strings.Join(row, " | ") + "\n")
	}
	return b.String()
}

// roundTrip is d as a client reads it: served as JSON, decoded.
func roundTrip(t *testing.T, d *adminv3.ConfigDump) *Dump {
	t.Helper()
	js, err := Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Decode(js)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sidecarDump(t *testing.T, leaf []byte) *adminv3.ConfigDump {
	pack := func(m proto.Message) *anypb.Any {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	dr := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": {Fields: map[string]*structpb.Value{
		"config": structpb.NewStringValue("/apis/networking.istio.io/v1alpha3/namespaces/default/destination-rule/reviews")}}}}
	vs := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": {Fields: map[string]*structpb.Value{
		"config": structpb.NewStringValue("/apis/networking.istio.io/v1alpha3/namespaces/default/virtual-service/reviews")}}}}
	eds := func(name string) *clusterv3.Cluster {
		return &clusterv3.Cluster{Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}, Metadata: dr}
	}
	clusters := &adminv3.ClustersConfigDump{
		StaticClusters: []*adminv3.ClustersConfigDump_StaticCluster{{Cluster: pack(&clusterv3.Cluster{Name: "xds-grpc"})}},
		DynamicActiveClusters: []*adminv3.ClustersConfigDump_DynamicCluster{
			{Cluster: pack(eds("outbound|9080|v1|reviews.default.svc.cluster.local"))},
			{Cluster: pack(eds("outbound|9080||reviews.default.svc.cluster.local"))},
			{Cluster: pack(&clusterv3.Cluster{Name: "PassthroughCluster", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}})},
		},
	}
	sock := func(ip string, port uint32) *corev3.Address {
		return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
	}
	tcp := func(cluster string) *listenerv3.Filter {
		return &listenerv3.Filter{Name: wellknown.TCPProxy, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: pack(
			&tcpv3.TcpProxy{StatPrefix: cluster, ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: cluster}})}}
	}
	rds := &listenerv3.Filter{Name: wellknown.HTTPConnectionManager, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: pack(
		&hcmv3.HttpConnectionManager{RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: "9080"}}})}}
	listener := func(l *listenerv3.Listener) *adminv3.ListenersConfigDump_DynamicListener {
		return &adminv3.ListenersConfigDump_DynamicListener{Name: l.GetName(),
			ActiveState: &adminv3.ListenersConfigDump_DynamicListenerState{Listener: pack(l)}}
	}
	listeners := &adminv3.ListenersConfigDump{DynamicListeners: []*adminv3.ListenersConfigDump_DynamicListener{
		listener(&listenerv3.Listener{Name: "virtualOutbound", Address: sock("0.0.0.0", 15001), FilterChains: []*listenerv3.FilterChain{
			{FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(15001)}, Filters: []*listenerv3.Filter{tcp("BlackHoleCluster")}},
			{Filters: []*listenerv3.Filter{tcp("PassthroughCluster")}},
		}}),
		listener(&listenerv3.Listener{Name: "10.96.0.20_9090", Address: sock("10.96.0.20", 9090), FilterChains: []*listenerv3.FilterChain{{
			FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(9090),
				PrefixRanges: []*corev3.CidrRange{{AddressPrefix: "10.96.0.20", PrefixLen: wrapperspb.UInt32(32)}}},
			Filters: []*listenerv3.Filter{tcp("outbound|9090||db.default.svc.cluster.local")}}}}),
		listener(&listenerv3.Listener{Name: "0.0.0.0_9080", Address: sock("0.0.0.0", 9080),
			FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{rds}}}}),
	}}
	toCluster := func(c string) *routev3.Route_Route {
		return &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: c}}}
	}
	prefix := &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}
	routes := &adminv3.RoutesConfigDump{DynamicRouteConfigs: []*adminv3.RoutesConfigDump_DynamicRouteConfig{{RouteConfig: pack(&routev3.RouteConfiguration{
		Name: "9080", VirtualHosts: []*routev3.VirtualHost{
			{Name: "reviews.default.svc.cluster.local:9080", Domains: []string{"reviews.default.svc.cluster.local", "reviews",
				"reviews.default.svc", "reviews.default", "10.96.0.10", "reviews:9080"},
				Routes: []*routev3.Route{{Match: prefix, Action: toCluster("outbound|9080||reviews.default.svc.cluster.local"), Metadata: vs}}},
			{Name: "empty:9080", Domains: []string{"empty"}},
			{Name: "allow_any", Domains: []string{"*"}, Routes: []*routev3.Route{{Match: prefix, Action: toCluster("PassthroughCluster")}}},
		}})}}}
	lb := func(ip string, h corev3.HealthStatus) *endpointv3.LbEndpoint {
		return &endpointv3.LbEndpoint{HealthStatus: h, HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: sock(ip, 9080)}}}
	}
	endpoints := &adminv3.EndpointsConfigDump{DynamicEndpointConfigs: []*adminv3.EndpointsConfigDump_DynamicEndpointConfig{{
		EndpointConfig: pack(&endpointv3.ClusterLoadAssignment{ClusterName: "outbound|9080||reviews.default.svc.cluster.local",
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{
				lb("10.0.0.2", corev3.HealthStatus_UNHEALTHY), lb("10.0.0.1", corev3.HealthStatus_UNKNOWN)}}}})}}}
	secrets := &adminv3.SecretsConfigDump{
		DynamicActiveSecrets: []*adminv3.SecretsConfigDump_DynamicSecret{{Name: "default", Secret: pack(&tlsv3.Secret{Name: "default",
			Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
				CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: leaf}}}}})}},
		DynamicWarmingSecrets: []*adminv3.SecretsConfigDump_DynamicSecret{{Name: "ROOTCA", Secret: pack(&tlsv3.Secret{Name: "ROOTCA",
			Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{}}})}},
	}
	out := &adminv3.ConfigDump{}
	for _, m := range []proto.Message{clusters, endpoints, listeners, routes, secrets} {
		out.Configs = append(out.Configs, pack(m))
	}
	return out
}

// Marshal is protojson with the Resolver (for the tests: the commands
// print their own tables).
func Marshal(m proto.Message) ([]byte, error) {
	return protojson.MarshalOptions{Indent: "  ", Resolver: Resolver}.Marshal(m)
}
