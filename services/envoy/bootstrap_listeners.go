package envoy

import (
	"strconv"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	filelogv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	brotliv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/compression/brotli/compressor/v3"
	gzipv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/compression/gzip/compressor/v3"
	zstdv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/compression/zstd/compressor/v3"
	compressorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/compressor/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	proxyprotocolv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/proxy_protocol/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// statsContentTypes are the responses the :15090 listener compresses (Prometheus' text and
// protobuf formats, OpenMetrics').
var statsContentTypes = []string{"text/plain", "application/vnd.google.protobuf", "application/openmetrics-text", "application/openmetrics-protobuf"}

// metricsListener serves Envoy's Prometheus stats on <wildcard>:15090 (localhost only with
// METRICS_LOCALHOST_ACCESS_ONLY), compressed (brotli, zstd or gzip, as the client accepts) unless
// statsCompression is off.
func metricsListener(c BootstrapConfig, fam ipFamily, compress bool) *listenerv3.Listener {
	host, extra := fam.wildcard, fam.additionalWildcard
	if c.MetricsLocalhostOnly {
		host, extra = fam.localhost, fam.additionalLocalhost
	}
	var filters []*hcmv3.HttpFilter
	if compress {
		for _, lib := range []struct {
			name string
			cfg  proto.Message
		}{
			{"brotli", &brotliv3.Brotli{}},
			{"zstd", &zstdv3.Zstd{}},
			{"gzip", &gzipv3.Gzip{}},
		} {
			filters = append(filters, httpFilter("envoy.filters.http.compressor."+lib.name, &compressorv3.Compressor{
				CompressorLibrary: &corev3.TypedExtensionConfig{Name: "stats_" + lib.name, TypedConfig: mustAny(lib.cfg)},
				ResponseDirectionConfig: &compressorv3.Compressor_ResponseDirectionConfig{
					CommonConfig: &compressorv3.Compressor_CommonDirectionConfig{ContentType: statsContentTypes},
				},
			}))
		}
	}
	return httpListener(host, extra, c.EnvoyPrometheusPort, "stats", statsCluster, []string{"/stats/prometheus"}, filters)
}

// healthListener forwards /healthz/ready on <wildcard>:15021 to the agent's status port, so that
// readiness also proves Envoy is serving. With ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL it accepts
// requests behind a PROXY protocol header too.
func healthListener(c BootstrapConfig, fam ipFamily) *listenerv3.Listener {
	l := httpListener(fam.wildcard, fam.additionalWildcard, c.EnvoyStatusPort, "agent", agentCluster, []string{"/healthz/ready"}, nil)
	if c.StatusPortProxyProtocol {
		l.ListenerFilters = []*listenerv3.ListenerFilter{{
			Name: "envoy.listener.proxy_protocol",
			ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(&proxyprotocolv3.ProxyProtocol{
				AllowRequestsWithoutProxyProtocol: true,
			})},
		}}
	}
	return l
}

// secureMetricsListener serves metrics over mTLS on <wildcard>:port with the workload certificate
// (SDS default and ROOTCA), clients must present one (ENVOY_SECURE_METRICS_PORT: Envoy's stats;
// ENVOY_SECURE_MERGED_METRICS_PORT: the agent's merged metrics).
func secureMetricsListener(fam ipFamily, port int, statPrefix, cluster string, prefixes ...string) *listenerv3.Listener {
	l := httpListener(fam.wildcard, "", port, statPrefix, cluster, prefixes, nil)
	l.ListenerFilters = []*listenerv3.ListenerFilter{{
		Name:       "envoy.filters.listener.tls_inspector",
		ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspectorv3.TlsInspector{})},
	}}
	secret := func(name string) *tlsv3.SdsSecretConfig {
		s := sdsSecretConfig(name)
		s.SdsConfig.InitialFetchTimeout = nil // Istio's template waits for these
		return s
	}
	fc := l.FilterChains[0]
	fc.FilterChainMatch = &listenerv3.FilterChainMatch{TransportProtocol: "tls"}
	fc.TransportSocket = &corev3.TransportSocket{
		Name: "envoy.transport_sockets.tls",
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(&tlsv3.DownstreamTlsContext{
			RequireClientCertificate: wrapperspb.Bool(true),
			CommonTlsContext: &tlsv3.CommonTlsContext{
				TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{secret(defaultSDSResource)},
				ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{
					CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
						DefaultValidationContext:         &tlsv3.CertificateValidationContext{},
						ValidationContextSdsSecretConfig: secret(rootSDSResource),
					},
				},
			},
		})},
	}
	return l
}

// httpListener is a static listener routing path prefixes to one cluster. These listeners are the
// agent's own: they ignore the global connection limit and the overload manager.
func httpListener(host, additional string, port int, statPrefix, cluster string, prefixes []string, filters []*hcmv3.HttpFilter) *listenerv3.Listener {
	var routes []*routev3.Route
	for _, prefix := range prefixes {
		routes = append(routes, &routev3.Route{
			Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: prefix}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{
				ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
			}},
		})
	}
	hcm := &hcmv3.HttpConnectionManager{
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		StatPrefix: statPrefix,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			VirtualHosts: []*routev3.VirtualHost{{Name: "backend", Domains: []string{"*"}, Routes: routes}},
		}},
		HttpFilters: append(filters, httpFilter("envoy.filters.http.router", &routerv3.Router{})),
	}
	l := &listenerv3.Listener{
		Name:    host + "_" + strconv.Itoa(port), // Envoy's listener stat form: 0.0.0.0_15090
		Address: socketAddress(host, port),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name:       "envoy.filters.network.http_connection_manager",
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm)},
		}}}},
		IgnoreGlobalConnLimit: true,
		BypassOverloadManager: true,
	}
	if additional != "" {
		l.AdditionalAddresses = []*listenerv3.AdditionalAddress{{Address: socketAddress(additional, port)}}
	}
	return l
}

func httpFilter(name string, cfg proto.Message) *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(cfg)}}
}

// devNullAccessLog discards the admin interface's access log, as Istio does.
func devNullAccessLog() *accesslogv3.AccessLog {
	return &accesslogv3.AccessLog{
		Name:       "envoy.access_loggers.file",
		ConfigType: &accesslogv3.AccessLog_TypedConfig{TypedConfig: mustAny(&filelogv3.FileAccessLog{Path: "/dev/null"})},
	}
}
