package xdsserver

import (
	"fmt"
	"net/netip"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshagent/meshagent/messages/nds"
)

// ads is a config source on the ADS stream.
func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:    corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	}
}

// Cluster is an EDS cluster fed over ADS, shaped like istiod's outbound
// clusters (name, timeouts, circuit breakers), so that a benchmark's
// message sizes are realistic.
func Cluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads(), ServiceName: name},
		ConnectTimeout:       durationpb.New(10 * time.Second),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		CircuitBreakers: &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
			MaxConnections:     wrapperspb.UInt32(4294967295),
			MaxPendingRequests: wrapperspb.UInt32(4294967295),
			MaxRequests:        wrapperspb.UInt32(4294967295),
			MaxRetries:         wrapperspb.UInt32(4294967295),
			TrackRemaining:     true,
		}}},
		CommonLbConfig: &clusterv3.Cluster_CommonLbConfig{
			LocalityConfigSpecifier: &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
				LocalityWeightedLbConfig: &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig{},
			},
		},
		Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": istioMeta(name)}},
	}
}

// istioMeta is the filter metadata istiod puts on a service's cluster.
func istioMeta(name string) *structpb.Struct {
	s, _ := structpb.NewStruct(map[string]any{
		"services": []any{map[string]any{"host": name, "name": name, "namespace": "default"}},
	})
	return s
}

// Clusters makes n clusters named "<prefix><i>|<i>.svc.cluster.local".
func Clusters(n int, prefix string) []types.Resource {
	out := make([]types.Resource, n)
	for i := range n {
		out[i] = Cluster(ClusterName(prefix, i))
	}
	return out
}

// ClusterName is the name Clusters gives cluster i.
func ClusterName(prefix string, i int) string {
	return fmt.Sprintf("outbound|80||%s%d.ns%d.svc.cluster.local", prefix, i, i%10)
}

// Endpoints is an EDS assignment: one locality (weight 1) with the given
// addresses.
func Endpoints(cluster string, addrs ...netip.AddrPort) *endpointv3.ClusterLoadAssignment {
	var lbs []*endpointv3.LbEndpoint
	for _, a := range addrs {
		lbs = append(lbs, &endpointv3.LbEndpoint{
			HealthStatus: corev3.HealthStatus_HEALTHY,
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address:       a.Addr().String(),
					PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(a.Port())},
				}}},
			}},
		})
	}
	return &endpointv3.ClusterLoadAssignment{
		ClusterName: cluster,
		Endpoints: []*endpointv3.LocalityLbEndpoints{{
			Locality:            &corev3.Locality{Region: "test"},
			LoadBalancingWeight: wrapperspb.UInt32(1),
			LbEndpoints:         lbs,
		}},
	}
}

// Listener is a listener whose HTTP connection manager takes its routes
// from RDS (routeName). With api true it is an API listener, what a
// proxyless gRPC client asks for by its target's name; otherwise it binds
// 0.0.0.0:port, as Envoy's listeners do.
func Listener(name, routeName string, api bool, port uint32) *listenerv3.Listener {
	router, _ := anypb.New(&routerv3.Router{})
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: name,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource: ads(), RouteConfigName: routeName,
		}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	}
	hcmAny, _ := anypb.New(hcm)
	if api {
		return &listenerv3.Listener{Name: name, ApiListener: &listenerv3.ApiListener{ApiListener: hcmAny}}
	}
	return &listenerv3.Listener{
		Name: name,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "0.0.0.0", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
		}}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcmAny},
		}}}},
	}
}

// Route is a route configuration sending every request for the given
// domains to cluster.
func Route(name, cluster string, domains ...string) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{
		Name: name,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    name,
			Domains: domains,
			Routes: []*routev3.Route{{
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}},
			}},
		}},
	}
}

// GRPCService is what a proxyless gRPC client needs to reach target
// ("xds:///<target>") at backend: an API listener, its route, a cluster
// and its endpoints.
type GRPCService struct {
	Listener *listenerv3.Listener
	Route    *routev3.RouteConfiguration
	Cluster  *clusterv3.Cluster
	Endpoint *endpointv3.ClusterLoadAssignment
}

// NewGRPCService builds the resources for target served at backend.
func NewGRPCService(target string, backend netip.AddrPort) GRPCService {
	cluster := "outbound|" + fmt.Sprint(backend.Port()) + "||" + target
	return GRPCService{
		Listener: Listener(target, "route-"+target, true, 0),
		Route:    Route("route-"+target, cluster, target),
		Cluster:  Cluster(cluster),
		Endpoint: Endpoints(cluster, backend),
	}
}

// NameTable is an NDS table mapping each host to one address.
func NameTable(hosts map[string]string) *nds.NameTable {
	t := &nds.NameTable{Table: map[string]*nds.NameTable_NameInfo{}}
	for h, ip := range hosts {
		t.Table[h] = &nds.NameTable_NameInfo{Ips: []string{ip}, Registry: "Kubernetes"}
	}
	return t
}

// SmallMesh is a small mesh as istiod would send it: two services of
// namespace ns (EDS clusters with their endpoints on loopback) and an
// inbound listener with its route, all named after version.
func SmallMesh(version, ns string) (clusters, listeners, routes, endpoints []types.Resource) {
	for i, svc := range []string{"reviews", "ratings"} {
		name := fmt.Sprintf("outbound|9080||%s.%s.svc.cluster.local", svc, ns)
		clusters = append(clusters, Cluster(name))
		endpoints = append(endpoints, Endpoints(name, netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", 19080+i))))
	}
	listeners = []types.Resource{Listener("virtualInbound", "inbound|"+version, false, 15006)}
	routes = []types.Resource{Route("inbound|"+version, fmt.Sprintf("outbound|9080||reviews.%s.svc.cluster.local", ns), "*")}
	return clusters, listeners, routes, endpoints
}

// StartSmallMesh starts a server with opts serving SmallMesh("v1", ns),
// and the name table if there is one: the control plane most tests and
// benches give an agent or an Envoy to turn ready on.
func StartSmallMesh(opts Options, ns string, table *nds.NameTable) (*Server, error) {
	s, err := Start(opts)
	if err != nil {
		return nil, err
	}
	c, l, r, e := SmallMesh("v1", ns)
	if err := s.SetSnapshot("v1", c, l, r, e, table); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// SDSSecret is an SdsSecretConfig as istiod sends it for "default" and
// "ROOTCA" (pkg/model/authentication.go): over gRPC to the agent's
// sds-grpc, with the given initial_fetch_timeout (Istio's: 0s, wait
// forever).
func SDSSecret(name string, timeout time.Duration) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
			ApiType: corev3.ApiConfigSource_GRPC, TransportApiVersion: corev3.ApiVersion_V3, SetNodeOnFirstMessageOnly: true,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "sds-grpc"}}}},
		}},
		ResourceApiVersion: corev3.ApiVersion_V3, InitialFetchTimeout: durationpb.New(timeout),
	}}
}

// MTLSCluster is a cluster whose transport socket, under istiod's
// tlsMode-istio match, names a certificate and a root over SDS: Envoy
// keeps it warming, and itself PRE_INITIALIZING, until both have come.
func MTLSCluster(name string, cert, root *tlsv3.SdsSecretConfig) *clusterv3.Cluster {
	tlsCtx, err := anypb.New(&tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{cert},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext: &tlsv3.CertificateValidationContext{}, ValidationContextSdsSecretConfig: root}},
	}})
	if err != nil {
		panic(err) // a well-formed message always packs
	}
	return &clusterv3.Cluster{Name: name, ConnectTimeout: durationpb.New(time.Second),
		TransportSocketMatches: []*clusterv3.Cluster_TransportSocketMatch{{Name: "tlsMode-istio",
			TransportSocket: &corev3.TransportSocket{Name: "envoy.transport_sockets.tls",
				ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: tlsCtx}}}}}
}
