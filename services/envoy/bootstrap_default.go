package envoy

import (
	"fmt"
	"maps"
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
	internallistenerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/bootstrap/internal_listener/v3"
	commonlbv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/common/v3"
	leastrequestv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	downstreamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Istio's fixed values in the default bootstrap.
const (
	xdsCluster       = "xds-grpc"
	sdsCluster       = "sds-grpc"
	sdsFilesCluster  = "sds-files-grpc"
	agentCluster     = "agent"
	statsCluster     = "prometheus_stats"
	localClusterName = "local_cluster"

	adminProfilePath = "/var/lib/istio/data/envoy.prof"
	textLogFormat    = "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t"
	// maxConnections is the global downstream connection limit when nothing sets one (MaxInt32).
	maxConnections = math.MaxInt32
	runtimeMaxConn = "overload.global_downstream_max_connections"
)

// ipFamily is the localhost/wildcard choice derived from the instance IPs (Istio's rules); with
// ISTIO_DUAL_STACK and both families the first IP's family is primary, the other additional.
type ipFamily struct {
	localhost, wildcard                     string
	additionalLocalhost, additionalWildcard string
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
		return ipFamily{localhost: "::1", wildcard: "::", additionalLocalhost: "127.0.0.1", additionalWildcard: "0.0.0.0", lookup: clusterv3.Cluster_ALL}
	default:
		return ipFamily{localhost: "127.0.0.1", wildcard: "0.0.0.0", additionalLocalhost: "::1", additionalWildcard: "::", lookup: clusterv3.Cluster_ALL}
	}
}

// defaultBootstrap is the equivalent of Istio's envoy_bootstrap.json built from Envoy's own types:
// field for field what Istio's agent writes from the same inputs (cmd/meshagent's conformance
// suite compares them), but for the few differences its README lists.
func defaultBootstrap(c BootstrapConfig, node nodeInfo) (*bootstrapv3.Bootstrap, error) {
	fam := ipFamilyFor(c.InstanceIPs, c.DualStack)
	stats := getStatsOptions(c, node)
	metadataDiscovery := c.metadataDiscoveryExtension(node)
	runtime, maxConn, err := runtimeFlags(c)
	if err != nil {
		return nil, err
	}
	telemetry, err := telemetryFor(c, node, fam)
	if err != nil {
		return nil, err
	}

	clusters := []*clusterv3.Cluster{
		staticCluster(statsCluster, 250*time.Millisecond, socketAddress(fam.localhost, c.AdminPort)),
		staticCluster(agentCluster, 250*time.Millisecond, socketAddress(fam.localhost, c.StatusPort)),
		sdsGRPCCluster(sdsCluster, c.SDSSocket),
	}
	if c.FilesSDSSocket != "" {
		clusters = append(clusters, sdsGRPCCluster(sdsFilesCluster, c.FilesSDSSocket))
	}
	clusters = append(clusters, xdsGRPCCluster(c.XDSSocket))
	clusters = append(clusters, telemetry.clusters...)
	selfDiscovery := node.raw["ENABLE_SELF_DISCOVERY"] == "true"
	if selfDiscovery {
		clusters = append(clusters, localCluster())
	}

	listeners := []*listenerv3.Listener{metricsListener(c, fam, stats.compression)}
	if c.SecureMetricsPort != 0 {
		listeners = append(listeners, secureMetricsListener(fam, c.SecureMetricsPort, "secure_stats", statsCluster, "/stats/prometheus"))
	}
	if c.SecureMergedMetricsPort != 0 {
		listeners = append(listeners, secureMetricsListener(fam, c.SecureMergedMetricsPort, "secure_merged_stats", agentCluster, "/stats/prometheus", "/metrics"))
	}
	listeners = append(listeners, healthListener(c, fam))

	b := &bootstrapv3.Bootstrap{
		Node:                 &corev3.Node{Id: node.id, Cluster: node.cluster, Locality: node.locality, Metadata: node.metadata},
		ApplicationLogConfig: applicationLog(c.LogAsJSON),
		LayeredRuntime: &bootstrapv3.LayeredRuntime{Layers: []*bootstrapv3.RuntimeLayer{
			{Name: "global config", LayerSpecifier: &bootstrapv3.RuntimeLayer_StaticLayer{StaticLayer: runtime}},
			{Name: "admin", LayerSpecifier: &bootstrapv3.RuntimeLayer_AdminLayer_{AdminLayer: &bootstrapv3.RuntimeLayer_AdminLayer{}}},
		}},
		BootstrapExtensions: bootstrapExtensions(metadataDiscovery),
		StatsConfig:         statsConfig(stats, metadataDiscovery),
		StatsFlushInterval:  statsFlush(stats),
		StatsSinks:          telemetry.sinks,
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
		StaticResources:  &bootstrapv3.Bootstrap_StaticResources{Clusters: clusters, Listeners: listeners},
		Tracing:          telemetry.tracing,
		// Istio's: stats are created when first used, not for every cluster up front.
		DeferredStatOptions: &bootstrapv3.Bootstrap_DeferredStatOptions{EnableDeferredCreationStats: true},
	}
	if d := statsEviction(stats); d != nil {
		b.StatsEviction = &bootstrapv3.Bootstrap_StatsEvictionInterval{StatsEvictionInterval: d}
	}
	lrs, err := loadStatsConfig(node)
	if err != nil {
		return nil, err
	}
	if c.OutlierLogPath != "" || lrs != nil || selfDiscovery {
		cm := &bootstrapv3.ClusterManager{LoadStatsConfig: lrs, EnableDeferredClusterCreation: true}
		if selfDiscovery {
			cm.LocalClusterName = localClusterName
		}
		if c.OutlierLogPath != "" {
			cm.OutlierDetection = &bootstrapv3.ClusterManager_OutlierDetection{EventLogPath: c.OutlierLogPath}
		}
		b.ClusterManager = cm
	}
	return b, nil
}

// Runtime flags Istio's agent sets in the static layer (pkg/bootstrap/config.go extractRuntimeFlags).
var istioRuntimeFlags = map[string]any{
	"re2.max_program_size.error_level": "32768",
	"envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst": true,
	"envoy.reloadable_features.http_reject_path_with_fragment":                                             false,
	"envoy.reloadable_features.fixed_heap_use_allocated":                                                   true,
	// Off in Istio for envoyproxy/envoy#45212.
	"envoy.reloadable_features.coalesce_lb_rebuilds_on_batch_update": false,
}

// runtimeFlags is Istio's static runtime layer plus ProxyConfig.runtimeValues ("" removes a default;
// "true"/"false" become booleans, anything else stays a string), and the global connection limit
// for the overload manager: ProxyConfig.proxyMetadata's ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS,
// else the runtime value overload.global_downstream_max_connections, else MaxInt32. As in Istio, the
// environment's ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS is node metadata only; unlike Istio, a
// limit that is not a number is an error rather than ignored.
func runtimeFlags(c BootstrapConfig) (*structpb.Struct, int64, error) {
	flags := maps.Clone(istioRuntimeFlags)
	if c.CompliancePolicy == "fips-140-2" {
		// Envoy's google_grpc clients then stay at TLS 1.2, FIPS 140-2's maximum.
		flags["envoy.reloadable_features.google_grpc_disable_tls_13"] = true
	}
	if c.KeepPathFragment {
		flags["envoy.reloadable_features.http_strip_fragment_from_path_unsafe_if_disabled"] = "false"
	}
	for k, v := range c.Proxy.GetRuntimeValues() {
		switch v {
		case "":
			delete(flags, k)
		case "true":
			flags[k] = true
		case "false":
			flags[k] = false
		default:
			flags[k] = v
		}
	}
	maxConn := int64(maxConnections)
	limit := func(what, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%s = %q: not a connection count", what, v)
		}
		maxConn = n
		return nil
	}
	if v, ok := c.Proxy.GetProxyMetadata()[metaPrefix+"GLOBAL_DOWNSTREAM_MAX_CONNECTIONS"]; ok {
		if err := limit("ProxyConfig.proxyMetadata[ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS]", v); err != nil {
			return nil, 0, err
		}
	} else if v, ok := c.Proxy.GetRuntimeValues()[runtimeMaxConn]; ok {
		if err := limit("ProxyConfig.runtimeValues["+runtimeMaxConn+"]", v); err != nil {
			return nil, 0, err
		}
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

// staticCluster is one of the bootstrap's own clusters; its stats are named <name>; (Istio's
// alt_stat_name, matched by the cluster_name stats tag).
func staticCluster(name string, connectTimeout time.Duration, addr *corev3.Address) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		AltStatName:          name + ";",
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(connectTimeout),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		LoadAssignment:       loadAssignment(name, addr),
	}
}

// sdsGRPCCluster reaches an SDS server on a unix socket: the agent's (sds-grpc), or, when an
// external SDS server holds the workload identity, the agent's file-only one (sds-files-grpc).
func sdsGRPCCluster(name, socket string) *clusterv3.Cluster {
	c := staticCluster(name, time.Second, pipeAddress(socket))
	c.TypedExtensionProtocolOptions = http2Options(0)
	return c
}

// xdsGRPCCluster reaches the agent's XDS proxy. Istio's template sets the deprecated cluster-level
// max_requests_per_connection: 1; here it lives in HttpProtocolOptions, where Envoy now reads it
// (a difference the README lists).
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

// localCluster is the pod's own service, from the control plane, for zone-aware load balancing
// (ISTIO_META_ENABLE_SELF_DISCOVERY).
func localCluster() *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 localClusterName,
		AltStatName:          localClusterName + ";",
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		ConnectTimeout:       durationpb.New(time.Second),
		LoadBalancingPolicy: &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
			TypedExtensionConfig: &corev3.TypedExtensionConfig{
				Name: "envoy.load_balancing_policies.least_request",
				TypedConfig: mustAny(&leastrequestv3.LeastRequest{LocalityLbConfig: &commonlbv3.LocalityLbConfig{
					LocalityConfigSpecifier: &commonlbv3.LocalityLbConfig_ZoneAwareLbConfig_{ZoneAwareLbConfig: &commonlbv3.LocalityLbConfig_ZoneAwareLbConfig{
						MinClusterSize: wrapperspb.UInt64(1),
					}},
				}}),
			},
		}}},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig: &corev3.ConfigSource{
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
				ResourceApiVersion:    corev3.ApiVersion_V3,
			},
			ServiceName: localClusterName,
		},
	}
}

// loadStatsConfig is the cluster manager's load reporting service, from the metadata
// LOAD_STATS_CONFIG_JSON (an ApiConfigSource in JSON); nil without it.
func loadStatsConfig(node nodeInfo) (*corev3.ApiConfigSource, error) {
	js, ok := node.raw["LOAD_STATS_CONFIG_JSON"].(string)
	if !ok {
		return nil, nil
	}
	src := &corev3.ApiConfigSource{}
	if err := protojson.Unmarshal([]byte(js), src); err != nil {
		return nil, fmt.Errorf("node metadata LOAD_STATS_CONFIG_JSON: not an ApiConfigSource: %w", err)
	}
	return src, nil
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
