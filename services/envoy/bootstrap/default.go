package bootstrap

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
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
	lookup                                  string // Cluster.DnsLookupFamily
}

func ipFamilyFor(ips []string, dualStack bool) ipFamily {
	v4 := ipFamily{localhost: "127.0.0.1", wildcard: "0.0.0.0", lookup: "V4_ONLY"}
	switch {
	case AllIPv4(ips):
		return v4
	case AllIPv6(ips):
		return ipFamily{localhost: "::1", wildcard: "::", lookup: "V6_ONLY"}
	case !dualStack:
		return v4
	case net.ParseIP(ips[0]).To4() == nil:
		return ipFamily{localhost: "::1", wildcard: "::", additionalLocalhost: "127.0.0.1", additionalWildcard: "0.0.0.0", lookup: "ALL"}
	default:
		return ipFamily{localhost: "127.0.0.1", wildcard: "0.0.0.0", additionalLocalhost: "::1", additionalWildcard: "::", lookup: "ALL"}
	}
}

// defaultBootstrap is the equivalent of Istio's envoy_bootstrap.json: field for field what
// Istio's agent writes from the same inputs (cmd/meshagent's conformance suite compares them), but
// for the few differences docs/conformance.md lists.
func defaultBootstrap(c Config, node nodeInfo) (object, error) {
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
	nodeJSON, err := node.bootstrapJSON()
	if err != nil {
		return nil, err
	}

	clusters := []object{
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

	listeners := []object{metricsListener(c, fam, stats.compression)}
	if c.SecureMetricsPort != 0 {
		listeners = append(listeners, secureMetricsListener(fam, c.SecureMetricsPort, "secure_stats", statsCluster, "/stats/prometheus"))
	}
	if c.SecureMergedMetricsPort != 0 {
		listeners = append(listeners, secureMetricsListener(fam, c.SecureMergedMetricsPort, "secure_merged_stats", agentCluster, "/stats/prometheus", "/metrics"))
	}
	listeners = append(listeners, healthListener(c, fam))

	connections := object{}
	if maxConn != 0 {
		connections["max_active_downstream_connections"] = int64JSON(maxConn)
	}
	b := object{
		"node":                   nodeJSON,
		"application_log_config": applicationLog(c.LogAsJSON),
		"layered_runtime": object{"layers": []object{
			{"name": "global config", "static_layer": runtime},
			{"name": "admin", "admin_layer": object{}},
		}},
		"bootstrap_extensions": bootstrapExtensions(metadataDiscovery),
		"stats_config":         statsConfig(stats, metadataDiscovery),
		"overload_manager": object{"resource_monitors": []object{{
			"name":         "envoy.resource_monitors.global_downstream_max_connections",
			"typed_config": typed("envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig", connections),
		}}},
		"admin": object{
			"access_log":   []object{devNullAccessLog()},
			"profile_path": adminProfilePath,
			"address":      socketAddress(fam.localhost, c.AdminPort),
		},
		"dynamic_resources": dynamicResources(c.DeltaXDS || c.ProxyType == "waypoint"),
		"static_resources":  object{"clusters": clusters, "listeners": listeners},
		// Istio's: stats are created when first used, not for every cluster up front.
		"deferred_stat_options": object{"enable_deferred_creation_stats": true},
	}
	b.set("stats_flush_interval", statsFlush(stats))
	b.set("stats_sinks", telemetry.sinks)
	b.set("tracing", telemetry.tracing)
	b.set("stats_eviction_interval", statsEviction(stats))
	lrs, err := loadStatsConfig(node)
	if err != nil {
		return nil, err
	}
	if c.OutlierLogPath != "" || lrs != nil || selfDiscovery {
		cm := object{"enable_deferred_cluster_creation": true}
		cm.set("load_stats_config", lrs)
		if selfDiscovery {
			cm["local_cluster_name"] = localClusterName
		}
		if c.OutlierLogPath != "" {
			cm["outlier_detection"] = object{"event_log_path": c.OutlierLogPath}
		}
		b["cluster_manager"] = cm
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
func runtimeFlags(c Config) (map[string]any, int64, error) {
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
	return flags, maxConn, nil
}

func applicationLog(asJSON bool) object {
	format := object{"text_format": textLogFormat}
	if asJSON {
		format = object{"json_format": object{
			"level": "%l", "time": "%Y-%m-%dT%T.%fZ", "scope": "envoy %n", "msg": "%j", "caller": "%g:%#", "thread": "%t",
		}}
	}
	return object{"log_format": format}
}

func bootstrapExtensions(metadataDiscovery bool) []object {
	var ext []object
	if metadataDiscovery {
		// Istio's own extension (istio.workload.BootstrapExtension) has no public Go type: a TypedStruct.
		ext = append(ext, object{
			"name": "metadata_discovery",
			"typed_config": typed("udpa.type.v1.TypedStruct", object{
				"type_url": "type.googleapis.com/istio.workload.BootstrapExtension",
				"value":    object{"config_source": object{"ads": object{}}},
			}),
		})
	}
	return append(ext, object{
		"name":         "envoy.bootstrap.internal_listener",
		"typed_config": typed("envoy.extensions.bootstrap.internal_listener.v3.InternalListener", object{"buffer_size_kb": 64}),
	})
}

func dynamicResources(delta bool) object {
	ads := func() object {
		return object{"ads": object{}, "initial_fetch_timeout": duration(0), "resource_api_version": "V3"}
	}
	apiType := "GRPC"
	if delta {
		apiType = "DELTA_GRPC"
	}
	return object{
		"lds_config": ads(),
		"cds_config": ads(),
		"ads_config": object{
			"api_type":                       apiType,
			"set_node_on_first_message_only": true,
			"transport_api_version":          "V3",
			"grpc_services":                  []object{envoyGRPC(xdsCluster)},
		},
	}
}

// envoyGRPC is a GrpcService reaching a cluster of this bootstrap.
func envoyGRPC(cluster string) object {
	return object{"envoy_grpc": object{"cluster_name": cluster}}
}

// staticCluster is one of the bootstrap's own clusters; its stats are named <name>; (Istio's
// alt_stat_name, matched by the cluster_name stats tag).
func staticCluster(name string, connectTimeout time.Duration, addr object) object {
	return object{
		"name":            name,
		"alt_stat_name":   name + ";",
		"type":            "STATIC",
		"connect_timeout": duration(connectTimeout),
		"load_assignment": loadAssignment(name, addr),
	}
}

// sdsGRPCCluster reaches an SDS server on a unix socket: the agent's (sds-grpc), or, when an
// external SDS server holds the workload identity, the agent's file-only one (sds-files-grpc).
func sdsGRPCCluster(name, socket string) object {
	c := staticCluster(name, time.Second, pipeAddress(socket))
	c["typed_extension_protocol_options"] = http2Options(0)
	return c
}

// xdsGRPCCluster reaches the agent's XDS proxy. Istio's template sets the deprecated cluster-level
// max_requests_per_connection: 1; here it lives in HttpProtocolOptions, where Envoy now reads it
// (a difference docs/conformance.md lists).
func xdsGRPCCluster(socket string) object {
	c := staticCluster(xdsCluster, time.Second, pipeAddress(socket))
	threshold := func(priority string) object {
		t := object{"max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000}
		t.set("priority", priority)
		return t
	}
	c["circuit_breakers"] = object{"thresholds": []object{threshold(""), threshold("HIGH")}}
	c["upstream_connection_options"] = object{"tcp_keepalive": object{"keepalive_time": 300}}
	c["typed_extension_protocol_options"] = http2Options(1)
	return c
}

// localCluster is the pod's own service, from the control plane, for zone-aware load balancing
// (ISTIO_META_ENABLE_SELF_DISCOVERY).
func localCluster() object {
	return object{
		"name":            localClusterName,
		"alt_stat_name":   localClusterName + ";",
		"type":            "EDS",
		"connect_timeout": duration(time.Second),
		"load_balancing_policy": object{"policies": []object{{
			"typed_extension_config": object{
				"name": "envoy.load_balancing_policies.least_request",
				"typed_config": typed("envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest", object{
					"locality_lb_config": object{"zone_aware_lb_config": object{"min_cluster_size": int64JSON(1)}},
				}),
			},
		}}},
		"eds_cluster_config": object{
			"eds_config":   object{"ads": object{}, "resource_api_version": "V3"},
			"service_name": localClusterName,
		},
	}
}

// loadStatsConfig is the cluster manager's load reporting service, from the metadata
// LOAD_STATS_CONFIG_JSON (an ApiConfigSource in JSON, checked against Envoy's type); nil without it.
func loadStatsConfig(node nodeInfo) (json.RawMessage, error) {
	js, ok := node.raw["LOAD_STATS_CONFIG_JSON"].(string)
	if !ok {
		return nil, nil
	}
	src := &corev3.ApiConfigSource{}
	if err := protojson.Unmarshal([]byte(js), src); err != nil {
		return nil, fmt.Errorf("node metadata LOAD_STATS_CONFIG_JSON: not an ApiConfigSource: %w", err)
	}
	out, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(src)
	if err != nil {
		return nil, fmt.Errorf("node metadata LOAD_STATS_CONFIG_JSON: %w", err)
	}
	return out, nil
}

// http2Options makes a cluster speak HTTP/2 (gRPC); maxRequests > 0 limits requests per connection.
func http2Options(maxRequests uint32) object {
	const name = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	opts := object{"explicit_http_config": object{"http2_protocol_options": object{}}}
	if maxRequests > 0 {
		opts["common_http_protocol_options"] = object{"max_requests_per_connection": maxRequests}
	}
	return object{name: typed(name, opts)}
}

func loadAssignment(cluster string, addr object) object {
	return object{
		"cluster_name": cluster,
		"endpoints":    []object{{"lb_endpoints": []object{{"endpoint": object{"address": addr}}}}},
	}
}

func socketAddress(host string, port int) object {
	return object{"socket_address": object{"address": host, "port_value": port}}
}

func pipeAddress(path string) object {
	return object{"pipe": object{"path": path}}
}
