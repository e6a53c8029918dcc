package envoy

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	tracev3 "github.com/envoyproxy/go-control-plane/envoy/config/trace/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
)

// The telemetry parts of Istio's bootstrap, from ProxyConfig: the tracer (zipkin, lightstep or
// datadog, with its TLS settings), the metrics service and its stats sink, the access log service,
// the statsd sink.

// Cluster names Istio's template gives them.
const (
	zipkinName           = "zipkin"
	lightstepName        = "lightstep"
	datadogName          = "datadog_agent"
	metricsServiceName   = "envoy_metrics_service"
	accessLogServiceName = "envoy_accesslog_service"
	lightstepTokenFile   = "lightstep_access_token.txt" // in ConfigPath
	tracerSNI            = "tracer"
	defaultSDSResource   = "default"
	rootSDSResource      = "ROOTCA"
	statsdSinkName       = "envoy.stat_sinks.statsd"
	metricsServiceSink   = "envoy.stat_sinks.metrics_service"
)

// telemetry is what the telemetry settings add to the bootstrap.
type telemetry struct {
	clusters []*clusterv3.Cluster
	sinks    []*metricsv3.StatsSink
	tracing  *tracev3.Tracing
}

// telemetryFor builds the telemetry parts, in the order of Istio's template: the tracer's cluster,
// the metrics service's, the access log service's; the metrics service sink, then statsd.
func telemetryFor(c BootstrapConfig, node nodeInfo, fam ipFamily) (telemetry, error) {
	var t telemetry
	pc := c.Proxy
	if tr := pc.GetTracing(); tr != nil {
		var (
			cl  *clusterv3.Cluster
			err error
			h2  bool
		)
		switch tracer := tr.GetTracer().(type) {
		case *meshv1alpha1.Tracing_Zipkin_:
			if cl, err = c.dnsCluster(zipkinName, "ProxyConfig.tracing.zipkin.address", tracer.Zipkin.GetAddress(), fam); err == nil && cl != nil {
				cl.DnsRefreshRate = durationpb.New(30 * time.Second)
				t.tracing = &tracev3.Tracing{Http: &tracev3.Tracing_Http{
					Name: "envoy.tracers.zipkin",
					ConfigType: &tracev3.Tracing_Http_TypedConfig{TypedConfig: mustAny(&tracev3.ZipkinConfig{
						CollectorCluster:         zipkinName,
						CollectorEndpoint:        "/api/v2/spans",
						CollectorEndpointVersion: tracev3.ZipkinConfig_HTTP_JSON,
						TraceId_128Bit:           true,
						SharedSpanContext:        wrapperspb.Bool(false),
					})},
				}}
			}
		case *meshv1alpha1.Tracing_Lightstep_:
			h2 = true
			if cl, err = c.dnsCluster(lightstepName, "ProxyConfig.tracing.lightstep.address", tracer.Lightstep.GetAddress(), fam); err == nil && cl != nil {
				cl.TypedExtensionProtocolOptions = http2Options(0)
				t.tracing = &tracev3.Tracing{Http: &tracev3.Tracing_Http{
					Name: "envoy.tracers.lightstep",
					ConfigType: &tracev3.Tracing_Http_TypedConfig{TypedConfig: mustAny(&tracev3.LightstepConfig{
						CollectorCluster: lightstepName,
						AccessTokenFile:  filepath.Join(c.ConfigPath, lightstepTokenFile),
					})},
				}}
			}
		case *meshv1alpha1.Tracing_Datadog_:
			if cl, err = c.dnsCluster(datadogName, "ProxyConfig.tracing.datadog.address", tracer.Datadog.GetAddress(), fam); err == nil && cl != nil {
				t.tracing = &tracev3.Tracing{Http: &tracev3.Tracing_Http{
					Name: "envoy.tracers.datadog",
					ConfigType: &tracev3.Tracing_Http_TypedConfig{TypedConfig: mustAny(&tracev3.DatadogConfig{
						CollectorCluster: datadogName,
						ServiceName:      node.cluster,
					})},
				}}
			}
		case *meshv1alpha1.Tracing_Stackdriver_:
			// Istio's template has no stackdriver tracer, but its agent refuses one without a project.
			if c.Platform.Metadata["gcp_project"] == "" {
				return t, fmt.Errorf("ProxyConfig.tracing.stackdriver: no GCP project in the platform metadata (GCP_METADATA)")
			}
		}
		if err != nil {
			return t, err
		}
		if cl != nil {
			cl.TransportSocket = upstreamTLS(tr.GetTlsSettings(), tracerSNI, node.raw, h2)
			t.clusters = append(t.clusters, cl)
		}
	}

	if ms := pc.GetEnvoyMetricsService(); ms.GetAddress() != "" {
		cl, err := c.dnsCluster(metricsServiceName, "ProxyConfig.envoyMetricsService.address", ms.GetAddress(), fam)
		if err != nil {
			return t, err
		}
		cl.TransportSocket = upstreamTLS(ms.GetTlsSettings(), metricsServiceName, node.raw, true)
		cl.UpstreamConnectionOptions = keepalive(ms.GetTcpKeepalive())
		cl.TypedExtensionProtocolOptions = http2Options(0)
		t.clusters = append(t.clusters, cl)
		t.sinks = append(t.sinks, &metricsv3.StatsSink{
			Name: metricsServiceSink,
			ConfigType: &metricsv3.StatsSink_TypedConfig{TypedConfig: mustAny(&metricsv3.MetricsServiceConfig{
				TransportApiVersion: corev3.ApiVersion_V3,
				GrpcService: &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
					EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: metricsServiceName},
				}},
			})},
		})
	}
	if als := pc.GetEnvoyAccessLogService(); als.GetAddress() != "" {
		cl, err := c.dnsCluster(accessLogServiceName, "ProxyConfig.envoyAccessLogService.address", als.GetAddress(), fam)
		if err != nil {
			return t, err
		}
		cl.TransportSocket = upstreamTLS(als.GetTlsSettings(), accessLogServiceName, node.raw, true)
		cl.UpstreamConnectionOptions = keepalive(als.GetTcpKeepalive())
		cl.TypedExtensionProtocolOptions = http2Options(0)
		t.clusters = append(t.clusters, cl)
	}
	if addr := pc.GetStatsdUdpAddress(); addr != "" {
		sa, err := c.serviceAddress("ProxyConfig.statsdUdpAddress", addr)
		if err != nil {
			return t, err
		}
		t.sinks = append(t.sinks, &metricsv3.StatsSink{
			Name: statsdSinkName,
			ConfigType: &metricsv3.StatsSink_TypedConfig{TypedConfig: mustAny(&metricsv3.StatsdSink{
				StatsdSpecifier: &metricsv3.StatsdSink_Address{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: sa}}},
			})},
		})
	}
	return t, nil
}

// dnsCluster is a cluster reaching a telemetry service by DNS name at addr (host:port); nil for an
// empty address, which Istio's template leaves out.
func (c BootstrapConfig) dnsCluster(name, what, addr string, fam ipFamily) (*clusterv3.Cluster, error) {
	if addr == "" {
		return nil, nil
	}
	sa, err := c.serviceAddress(what, addr)
	if err != nil {
		return nil, err
	}
	return &clusterv3.Cluster{
		Name:                 name,
		AltStatName:          name + ";",
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		RespectDnsTtl:        true,
		DnsLookupFamily:      fam.lookup,
		ConnectTimeout:       durationpb.New(time.Second),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		LoadAssignment:       loadAssignment(name, &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: sa}}),
	}, nil
}

// serviceAddress is host:port as a socket address; a host of $(HOST_IP) is the node's HOST_IP
// when set (Istio's addressConverter: tracer addresses in mesh config cannot use Kubernetes'
// variable expansion).
func (c BootstrapConfig) serviceAddress(what, addr string) (*corev3.SocketAddress, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%s %q: want host:port: %w", what, addr, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("%s %q: bad port %q", what, addr, portText)
	}
	if host == "$(HOST_IP)" && c.HostIP != "" {
		host = c.HostIP
	}
	return &corev3.SocketAddress{Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)}}, nil
}

// keepalive is a telemetry cluster's TCP keepalive (nil: none set).
func keepalive(k *networkingv1alpha3.ConnectionPoolSettings_TCPSettings_TcpKeepalive) *clusterv3.UpstreamConnectionOptions {
	if k == nil {
		return nil
	}
	ka := &corev3.TcpKeepalive{}
	if k.GetProbes() > 0 {
		ka.KeepaliveProbes = wrapperspb.UInt32(k.GetProbes())
	}
	if s := k.GetTime().GetSeconds(); s > 0 {
		ka.KeepaliveTime = wrapperspb.UInt32(uint32(s))
	}
	if s := k.GetInterval().GetSeconds(); s > 0 {
		ka.KeepaliveInterval = wrapperspb.UInt32(uint32(s))
	}
	return &clusterv3.UpstreamConnectionOptions{TcpKeepalive: ka}
}

// upstreamTLS is the TLS transport socket of a telemetry cluster, as Istio's tlsContextConvert
// makes it: SIMPLE and MUTUAL read their files through SDS (file-root:, file-cert:), ISTIO_MUTUAL
// uses the workload certificate; the node metadata's TLS_CLIENT_* paths win over the settings'.
// nil without TLS. h2 keeps the ALPN (only lightstep and the gRPC services speak HTTP/2 here).
func upstreamTLS(tls *networkingv1alpha3.ClientTLSSettings, sni string, meta map[string]any, h2 bool) *corev3.TransportSocket {
	if tls == nil {
		return nil
	}
	orMeta := func(key, def string) string {
		if v, _ := meta[key].(string); v != "" {
			return v
		}
		return def
	}
	ctx := &tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{}, Sni: tls.GetSni()}
	fileRoot := func(path string) string {
		if path == "" {
			return ""
		}
		return "file-root:" + path
	}
	validation := func(name string) {
		ctx.CommonTlsContext.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{
			CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchSubjectAltNames: exactMatchers(tls.GetSubjectAltNames())},
				ValidationContextSdsSecretConfig: sdsSecretConfig(name),
			},
		}
	}
	switch tls.GetMode() {
	case networkingv1alpha3.ClientTLSSettings_SIMPLE:
		validation(fileRoot(orMeta("TLS_CLIENT_ROOT_CERT", tls.GetCaCertificates())))
		ctx.CommonTlsContext.AlpnProtocols = []string{"h2"}
	case networkingv1alpha3.ClientTLSSettings_MUTUAL:
		cert, key := orMeta("TLS_CLIENT_CERT_CHAIN", tls.GetClientCertificate()), orMeta("TLS_CLIENT_KEY", tls.GetPrivateKey())
		if cert != "" && key != "" {
			ctx.CommonTlsContext.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{sdsSecretConfig("file-cert:" + cert + "~" + key)}
		}
		validation(fileRoot(orMeta("TLS_CLIENT_ROOT_CERT", tls.GetCaCertificates())))
		ctx.CommonTlsContext.AlpnProtocols = []string{"h2"}
	case networkingv1alpha3.ClientTLSSettings_ISTIO_MUTUAL:
		ctx.CommonTlsContext.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{sdsSecretConfig(defaultSDSResource)}
		validation(rootSDSResource)
		ctx.CommonTlsContext.AlpnProtocols = []string{"istio", "h2"}
		if ctx.Sni == "" {
			ctx.Sni = sni
		}
	default:
		return nil
	}
	if !h2 {
		ctx.CommonTlsContext.AlpnProtocols = nil
	}
	return &corev3.TransportSocket{
		Name:       "envoy.transport_sockets.tls",
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)},
	}
}

// sdsSecretConfig asks the agent's SDS server (cluster sds-grpc) for a secret; the workload's own
// ("default", "ROOTCA") without waiting for it at start. nil for no name.
func sdsSecretConfig(name string) *tlsv3.SdsSecretConfig {
	if name == "" {
		return nil
	}
	src := &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
			ApiType:                   corev3.ApiConfigSource_GRPC,
			SetNodeOnFirstMessageOnly: true,
			TransportApiVersion:       corev3.ApiVersion_V3,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: sdsCluster},
			}}},
		}},
		ResourceApiVersion: corev3.ApiVersion_V3,
	}
	if name == defaultSDSResource || name == rootSDSResource {
		src.InitialFetchTimeout = durationpb.New(0)
	}
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: src}
}

func exactMatchers(names []string) []*matcherv3.StringMatcher {
	var out []*matcherv3.StringMatcher
	for _, n := range names {
		out = append(out, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: n}})
	}
	return out
}

// writeLightstepToken writes ProxyConfig.tracing.lightstep.accessToken where the lightstep tracer
// reads it (<ConfigPath>/lightstep_access_token.txt), as Istio's agent does before rendering.
func writeLightstepToken(c BootstrapConfig) error {
	ls := c.Proxy.GetTracing().GetLightstep()
	if ls == nil {
		return nil
	}
	//nolint:staticcheck // Istio still reads the deprecated lightstep settings.
	return writeAtomic(filepath.Join(c.ConfigPath, lightstepTokenFile), []byte(ls.GetAccessToken()))
}
