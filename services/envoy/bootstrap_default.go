package envoy

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"time"

	udpatypev1 "github.com/cncf/xds/go/udpa/type/v1"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	overloadv3 "github.com/envoyproxy/go-control-plane/envoy/config/overload/v3"
	tracev3 "github.com/envoyproxy/go-control-plane/envoy/config/trace/v3"
	internallistenerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/bootstrap/internal_listener/v3"
	downstreamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Istio's fixed values in the default bootstrap.
const (
	xdsCluster   = "xds-grpc"
	sdsCluster   = "sds-grpc"
	agentCluster = "agent"
	statsCluster = "prometheus_stats"
	zipkinName   = "zipkin"

	adminProfilePath = "/var/lib/istio/data/envoy.prof"
	textLogFormat    = "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t"
	// maxConnections is the global downstream connection limit when nothing sets one (MaxInt32).
	maxConnections = math.MaxInt32
	runtimeMaxConn = "overload.global_downstream_max_connections"
)

// ipFamily is the localhost/wildcard choice derived from the instance IPs (Istio's rules).
type ipFamily struct {
	localhost, wildcard, additionalWildcard string
	lookup                                  clusterv3.Cluster_DnsLookupFamily
}

func ipFamilyFor(ips []string, dualStack bool) ipFamily {
	v4 := ipFamily{localhost: "127.0.0.1", wildcard: "0.0.0.0", lookup: clusterv3.Cluster_V4_ONLY}
	switch {
	case AllIPv4(ips):
		return v4
	case AllIPv6(ips):
		return ipFamily{localhost: "::1", wildcard: "::", lookup: clusterv3.Cluster_V6_ONLY}
	case !dualStack:
		return v4
	case net.ParseIP(ips[0]).To4() == nil:
		return ipFamily{localhost: "::1", wildcard: "::", additionalWildcard: "0.0.0.0", lookup: clusterv3.Cluster_ALL}
	default:
		return ipFamily{localhost: "127.0.0.1", wildcard: "0.0.0.0", additionalWildcard: "::", lookup: clusterv3.Cluster_ALL}
	}
}

// defaultBootstrap is the equivalent of Istio's envoy_bootstrap.json built from Envoy's own types.
func defaultBootstrap(c BootstrapConfig, node nodeInfo) (*bootstrapv3.Bootstrap, error) {
	fam := ipFamilyFor(c.InstanceIPs, c.DualStack)
	stats := getStatsOptions(c, node)
	metadataDiscovery := c.metadataDiscoveryExtension(node)
	runtime, maxConn, err := runtimeFlags(c, node)
	if err != nil {
		return nil, err
	}

	b := &bootstrapv3.Bootstrap{
		Node:                 &corev3.Node{Id: node.id, Cluster: node.cluster, Locality: node.locality, Metadata: node.metadata},
		ApplicationLogConfig: applicationLog(c.LogAsJSON),
		LayeredRuntime: &bootstrapv3.LayeredRuntime{Layers: []*bootstrapv3.RuntimeLayer{
			{Name: "global config", LayerSpecifier: &bootstrapv3.RuntimeLayer_StaticLayer{StaticLayer: runtime}},
			{Name: "admin", LayerSpecifier: &bootstrapv3.RuntimeLayer_AdminLayer_{AdminLayer: &bootstrapv3.RuntimeLayer_AdminLayer{}}},
		}},
		StatsConfig:        statsConfig(stats, metadataDiscovery),
		StatsFlushInterval: statsFlush(stats),
		OverloadManager: &overloadv3.OverloadManager{ResourceMonitors: []*overloadv3.ResourceMonitor{{
			Name: "envoy.resource_monitors.global_downstream_max_connections",
			ConfigType: &overloadv3.ResourceMonitor_TypedConfig{TypedConfig: mustAny(
				&downstreamv3.DownstreamConnectionsConfig{MaxActiveDownstreamConnections: maxConn})},
		}}},
		Admin: &bootstrapv3.Admin{
			AccessLog:   []*accesslogv3.AccessLog{devNullAccessLog()},
			ProfilePath: adminProfilePath,
			Address:     socketAddress(fam.localhost, c.AdminPort),
		},
		DynamicResources: dynamicResources(c.DeltaXDS || c.ProxyType == "waypoint"),
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Clusters: []*clusterv3.Cluster{
				staticCluster(statsCluster, 250*time.Millisecond, socketAddress(fam.localhost, c.AdminPort)),
				staticCluster(agentCluster, 250*time.Millisecond, socketAddress(fam.localhost, c.StatusPort)),
				sdsGRPCCluster(c.SDSSocket),
				xdsGRPCCluster(c.XDSSocket),
			},
			Listeners: []*listenerv3.Listener{
				metricsListener(c, fam, stats.compression),
				healthListener(c, fam),
			},
		},
	}
	b.BootstrapExtensions = bootstrapExtensions(metadataDiscovery)
	if c.OutlierLogPath != "" {
		b.ClusterManager = &bootstrapv3.ClusterManager{OutlierDetection: &bootstrapv3.ClusterManager_OutlierDetection{EventLogPath: c.OutlierLogPath}}
	}
	if addr := c.Proxy.GetTracing().GetZipkin().GetAddress(); addr != "" {
		cl, tr, err := zipkinTracing(addr, fam)
		if err != nil {
			return nil, err
		}
		b.StaticResources.Clusters = append(b.StaticResources.Clusters, cl)
		b.Tracing = tr
	}
	return b, nil
}

// runtimeFlags is Istio's static runtime layer plus ProxyConfig.runtimeValues ("" removes a default;
// "true"/"false" become booleans). The global connection limit moves to the overload manager:
// ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS, else the runtime value, else MaxInt32.
func runtimeFlags(c BootstrapConfig, node nodeInfo) (*structpb.Struct, int64, error) {
	flags := map[string]any{
		"re2.max_program_size.error_level": "32768",
		"envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst": true,
		"envoy.reloadable_features.http_reject_path_with_fragment":                                             false,
	}
	maxConn := int64(maxConnections)
	for k, v := range c.Proxy.GetRuntimeValues() {
		switch {
		case k == runtimeMaxConn:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return nil, 0, fmt.Errorf("ProxyConfig.runtimeValues[%q] = %q: not a connection count", k, v)
			}
			maxConn = n
		case v == "":
			delete(flags, k)
		case v == "true":
			flags[k] = true
		case v == "false":
			flags[k] = false
		default:
			flags[k] = v
		}
	}
	if v, ok := node.raw["GLOBAL_DOWNSTREAM_MAX_CONNECTIONS"].(string); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return nil, 0, fmt.Errorf("ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS=%q: not a connection count", v)
		}
		maxConn = n
	}
	s, err := structpb.NewStruct(flags)
	if err != nil {
		return nil, 0, fmt.Errorf("runtime flags: %w", err)
	}
	return s, maxConn, nil
}

func applicationLog(asJSON bool) *bootstrapv3.Bootstrap_ApplicationLogConfig {
	f := &bootstrapv3.Bootstrap_ApplicationLogConfig_LogFormat{
		LogFormat: &bootstrapv3.Bootstrap_ApplicationLogConfig_LogFormat_TextFormat{TextFormat: textLogFormat},
	}
	if asJSON {
		js, _ := structpb.NewStruct(map[string]any{
			"level": "%l", "time": "%Y-%m-%dT%T.%fZ", "scope": "envoy %n", "msg": "%j", "caller": "%g:%#", "thread": "%t",
		})
		f.LogFormat = &bootstrapv3.Bootstrap_ApplicationLogConfig_LogFormat_JsonFormat{JsonFormat: js}
	}
	return &bootstrapv3.Bootstrap_ApplicationLogConfig{LogFormat: f}
}

func bootstrapExtensions(metadataDiscovery bool) []*corev3.TypedExtensionConfig {
	var ext []*corev3.TypedExtensionConfig
	if metadataDiscovery {
		// Istio's own extension (istio.workload.BootstrapExtension) has no public Go type: a TypedStruct.
		v, _ := structpb.NewStruct(map[string]any{"config_source": map[string]any{"ads": map[string]any{}}})
		ext = append(ext, &corev3.TypedExtensionConfig{
			Name: "metadata_discovery",
			TypedConfig: mustAny(&udpatypev1.TypedStruct{
				TypeUrl: "type.googleapis.com/istio.workload.BootstrapExtension", Value: v,
			}),
		})
	}
	return append(ext, &corev3.TypedExtensionConfig{
		Name:        "envoy.bootstrap.internal_listener",
		TypedConfig: mustAny(&internallistenerv3.InternalListener{BufferSizeKb: wrapperspb.UInt32(64)}),
	})
}

func dynamicResources(delta bool) *bootstrapv3.Bootstrap_DynamicResources {
	ads := func() *corev3.ConfigSource {
		return &corev3.ConfigSource{
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			InitialFetchTimeout:   durationpb.New(0),
			ResourceApiVersion:    corev3.ApiVersion_V3,
		}
	}
	apiType := corev3.ApiConfigSource_GRPC
	if delta {
		apiType = corev3.ApiConfigSource_DELTA_GRPC
	}
	return &bootstrapv3.Bootstrap_DynamicResources{
		LdsConfig: ads(),
		CdsConfig: ads(),
		AdsConfig: &corev3.ApiConfigSource{
			ApiType:                   apiType,
			SetNodeOnFirstMessageOnly: true,
			TransportApiVersion:       corev3.ApiVersion_V3,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: xdsCluster},
			}}},
		},
	}
}

func staticCluster(name string, connectTimeout time.Duration, addr *corev3.Address) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(connectTimeout),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		LoadAssignment:       loadAssignment(name, addr),
	}
}

func sdsGRPCCluster(socket string) *clusterv3.Cluster {
	c := staticCluster(sdsCluster, time.Second, pipeAddress(socket))
	c.TypedExtensionProtocolOptions = http2Options(0)
	return c
}

// xdsGRPCCluster reaches the agent's XDS proxy. Istio's template sets the deprecated cluster-level
// max_requests_per_connection: 1; here it lives in HttpProtocolOptions, where Envoy now reads it.
func xdsGRPCCluster(socket string) *clusterv3.Cluster {
	c := staticCluster(xdsCluster, time.Second, pipeAddress(socket))
	threshold := func(p corev3.RoutingPriority) *clusterv3.CircuitBreakers_Thresholds {
		return &clusterv3.CircuitBreakers_Thresholds{
			Priority:           p,
			MaxConnections:     wrapperspb.UInt32(100000),
			MaxPendingRequests: wrapperspb.UInt32(100000),
			MaxRequests:        wrapperspb.UInt32(100000),
		}
	}
	c.CircuitBreakers = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{
		threshold(corev3.RoutingPriority_DEFAULT), threshold(corev3.RoutingPriority_HIGH),
	}}
	c.UpstreamConnectionOptions = &clusterv3.UpstreamConnectionOptions{
		TcpKeepalive: &corev3.TcpKeepalive{KeepaliveTime: wrapperspb.UInt32(300)},
	}
	c.TypedExtensionProtocolOptions = http2Options(1)
	return c
}

// http2Options makes a cluster speak HTTP/2 (gRPC); maxRequests > 0 limits requests per connection.
func http2Options(maxRequests uint32) map[string]*anypb.Any {
	opts := &httpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
					Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
				},
			},
		},
	}
	if maxRequests > 0 {
		opts.CommonHttpProtocolOptions = &corev3.HttpProtocolOptions{MaxRequestsPerConnection: wrapperspb.UInt32(maxRequests)}
	}
	return map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(opts)}
}

// zipkinTracing is the zipkin cluster and tracer for ProxyConfig.tracing.zipkin.address (host:port).
func zipkinTracing(addr string, fam ipFamily) (*clusterv3.Cluster, *tracev3.Tracing, error) {
	host, portStr, err := net.SplitHostPort(addr)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || host == "" || port < 1 || port > 65535 {
		return nil, nil, fmt.Errorf("ProxyConfig.tracing.zipkin.address %q: want host:port", addr)
	}
	cl := &clusterv3.Cluster{
		Name:                 zipkinName,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		RespectDnsTtl:        true,
		DnsLookupFamily:      fam.lookup,
		DnsRefreshRate:       durationpb.New(30 * time.Second),
		ConnectTimeout:       durationpb.New(time.Second),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		LoadAssignment:       loadAssignment(zipkinName, socketAddress(host, port)),
	}
	tr := &tracev3.Tracing{Http: &tracev3.Tracing_Http{
		Name: "envoy.tracers.zipkin",
		ConfigType: &tracev3.Tracing_Http_TypedConfig{TypedConfig: mustAny(&tracev3.ZipkinConfig{
			CollectorCluster:         zipkinName,
			CollectorEndpoint:        "/api/v2/spans",
			CollectorEndpointVersion: tracev3.ZipkinConfig_HTTP_JSON,
			TraceId_128Bit:           true,
			SharedSpanContext:        wrapperspb.Bool(false),
		})},
	}}
	return cl, tr, nil
}

func loadAssignment(cluster string, addr *corev3.Address) *endpointv3.ClusterLoadAssignment {
	return &endpointv3.ClusterLoadAssignment{
		ClusterName: cluster,
		Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr}},
		}}}},
	}
}

func socketAddress(host string, port int) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Protocol:      corev3.SocketAddress_TCP,
		Address:       host,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
	}}}
}

func pipeAddress(path string) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: path}}}
}

func boolValue(b bool) *wrapperspb.BoolValue { return wrapperspb.Bool(b) }

// mustAny packs a message built in this package; it can only fail for a nil message (a bug here).
func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("envoy bootstrap: pack %T: %v", m, err))
	}
	return a
}
