package bootstrap

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

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
	clusters []object
	sinks    []object
	tracing  object
}

// telemetryFor builds the telemetry parts, in the order of Istio's template: the tracer's cluster,
// the metrics service's, the access log service's; the metrics service sink, then statsd.
func telemetryFor(c Config, node nodeInfo, fam ipFamily) (telemetry, error) {
	var t telemetry
	pc := c.Proxy
	if tr := pc.GetTracing(); tr != nil {
		var (
			cl  object
			err error
			h2  bool
		)
		tracer := func(name, message string, config object) object {
			return object{"http": object{"name": name, "typed_config": typed(message, config)}}
		}
		switch kind := tr.GetTracer().(type) {
		case *meshv1alpha1.Tracing_Zipkin_:
			if cl, err = c.dnsCluster(zipkinName, "ProxyConfig.tracing.zipkin.address", kind.Zipkin.GetAddress(), fam); err == nil && cl != nil {
				cl["dns_refresh_rate"] = duration(30 * time.Second)
				t.tracing = tracer("envoy.tracers.zipkin", "envoy.config.trace.v3.ZipkinConfig", object{
					"collector_cluster":          zipkinName,
					"collector_endpoint":         "/api/v2/spans",
					"collector_endpoint_version": "HTTP_JSON",
					"trace_id_128bit":            true,
					"shared_span_context":        false,
				})
			}
		case *meshv1alpha1.Tracing_Lightstep_:
			h2 = true
			if cl, err = c.dnsCluster(lightstepName, "ProxyConfig.tracing.lightstep.address", kind.Lightstep.GetAddress(), fam); err == nil && cl != nil {
				cl["typed_extension_protocol_options"] = http2Options(0)
				t.tracing = tracer("envoy.tracers.lightstep", "envoy.config.trace.v3.LightstepConfig", object{
					"collector_cluster": lightstepName,
					"access_token_file": filepath.Join(c.ConfigPath, lightstepTokenFile),
				})
			}
		case *meshv1alpha1.Tracing_Datadog_:
			if cl, err = c.dnsCluster(datadogName, "ProxyConfig.tracing.datadog.address", kind.Datadog.GetAddress(), fam); err == nil && cl != nil {
				config := object{"collector_cluster": datadogName}
				config.set("service_name", node.cluster)
				t.tracing = tracer("envoy.tracers.datadog", "envoy.config.trace.v3.DatadogConfig", config)
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
			cl.set("transport_socket", upstreamTLS(tr.GetTlsSettings(), tracerSNI, node.raw, h2))
			t.clusters = append(t.clusters, cl)
		}
	}

	if ms := pc.GetEnvoyMetricsService(); ms.GetAddress() != "" {
		cl, err := c.remoteServiceCluster(metricsServiceName, "ProxyConfig.envoyMetricsService.address", ms, node, fam)
		if err != nil {
			return t, err
		}
		t.clusters = append(t.clusters, cl)
		t.sinks = append(t.sinks, object{
			"name": metricsServiceSink,
			"typed_config": typed("envoy.config.metrics.v3.MetricsServiceConfig", object{
				"transport_api_version": "V3",
				"grpc_service":          envoyGRPC(metricsServiceName),
			}),
		})
	}
	if als := pc.GetEnvoyAccessLogService(); als.GetAddress() != "" {
		cl, err := c.remoteServiceCluster(accessLogServiceName, "ProxyConfig.envoyAccessLogService.address", als, node, fam)
		if err != nil {
			return t, err
		}
		t.clusters = append(t.clusters, cl)
	}
	if addr := pc.GetStatsdUdpAddress(); addr != "" {
		host, port, err := c.serviceAddress("ProxyConfig.statsdUdpAddress", addr)
		if err != nil {
			return t, err
		}
		t.sinks = append(t.sinks, object{
			"name":         statsdSinkName,
			"typed_config": typed("envoy.config.metrics.v3.StatsdSink", object{"address": socketAddress(host, port)}),
		})
	}
	return t, nil
}

// dnsCluster is a cluster reaching a telemetry service by DNS name at addr (host:port); nil for an
// empty address, which Istio's template leaves out.
func (c Config) dnsCluster(name, what, addr string, fam ipFamily) (object, error) {
	if addr == "" {
		return nil, nil
	}
	host, port, err := c.serviceAddress(what, addr)
	if err != nil {
		return nil, err
	}
	return object{
		"name":              name,
		"alt_stat_name":     name + ";",
		"type":              "STRICT_DNS",
		"respect_dns_ttl":   true,
		"dns_lookup_family": fam.lookup,
		"connect_timeout":   duration(time.Second),
		"load_assignment":   loadAssignment(name, socketAddress(host, port)),
	}, nil
}

// remoteServiceCluster is the HTTP/2 cluster of a gRPC service Envoy
// streams to (the metrics service, the access log service), with the
// service's TLS settings and TCP keepalive.
func (c Config) remoteServiceCluster(name, what string, rs *meshv1alpha1.RemoteService, node nodeInfo, fam ipFamily) (object, error) {
	cl, err := c.dnsCluster(name, what, rs.GetAddress(), fam)
	if err != nil {
		return nil, err
	}
	cl.set("transport_socket", upstreamTLS(rs.GetTlsSettings(), name, node.raw, true))
	cl.set("upstream_connection_options", keepalive(rs.GetTcpKeepalive()))
	cl["typed_extension_protocol_options"] = http2Options(0)
	return cl, nil
}

// serviceAddress is host:port as a socket address; a host of $(HOST_IP) is the node's HOST_IP
// when set (Istio's addressConverter: tracer addresses in mesh config cannot use Kubernetes'
// variable expansion).
func (c Config) serviceAddress(what, addr string) (host string, port int, err error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: want host:port: %w", what, addr, err)
	}
	p, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: bad port %q", what, addr, portText)
	}
	if host == "$(HOST_IP)" && c.HostIP != "" {
		host = c.HostIP
	}
	return host, int(p), nil
}

// keepalive is a telemetry cluster's TCP keepalive (nil: none set).
func keepalive(k *networkingv1alpha3.ConnectionPoolSettings_TCPSettings_TcpKeepalive) object {
	if k == nil {
		return nil
	}
	ka := object{}
	if k.GetProbes() > 0 {
		ka["keepalive_probes"] = k.GetProbes()
	}
	if s := k.GetTime().GetSeconds(); s > 0 {
		ka["keepalive_time"] = uint32(s)
	}
	if s := k.GetInterval().GetSeconds(); s > 0 {
		ka["keepalive_interval"] = uint32(s)
	}
	return object{"tcp_keepalive": ka}
}

// upstreamTLS is the TLS transport socket of a telemetry cluster, as Istio's tlsContextConvert
// makes it: SIMPLE and MUTUAL read their files through SDS (file-root:, file-cert:), ISTIO_MUTUAL
// uses the workload certificate; the node metadata's TLS_CLIENT_* paths win over the settings'.
// nil without TLS. h2 keeps the ALPN (only lightstep and the gRPC services speak HTTP/2 here).
func upstreamTLS(tls *networkingv1alpha3.ClientTLSSettings, sni string, meta map[string]any, h2 bool) object {
	if tls == nil {
		return nil
	}
	orMeta := func(key, def string) string {
		if v, _ := meta[key].(string); v != "" {
			return v
		}
		return def
	}
	common := object{}
	sniName := tls.GetSni()
	fileRoot := func(path string) string {
		if path == "" {
			return ""
		}
		return "file-root:" + path
	}
	validation := func(name string) {
		def := object{}
		def.set("match_subject_alt_names", exactMatchers(tls.GetSubjectAltNames()))
		combined := object{"default_validation_context": def}
		combined.set("validation_context_sds_secret_config", sdsSecretConfig(name))
		common["combined_validation_context"] = combined
	}
	var alpn []string
	switch tls.GetMode() {
	case networkingv1alpha3.ClientTLSSettings_SIMPLE:
		validation(fileRoot(orMeta("TLS_CLIENT_ROOT_CERT", tls.GetCaCertificates())))
		alpn = []string{"h2"}
	case networkingv1alpha3.ClientTLSSettings_MUTUAL:
		cert, key := orMeta("TLS_CLIENT_CERT_CHAIN", tls.GetClientCertificate()), orMeta("TLS_CLIENT_KEY", tls.GetPrivateKey())
		if cert != "" && key != "" {
			common["tls_certificate_sds_secret_configs"] = []object{sdsSecretConfig("file-cert:" + cert + "~" + key)}
		}
		validation(fileRoot(orMeta("TLS_CLIENT_ROOT_CERT", tls.GetCaCertificates())))
		alpn = []string{"h2"}
	case networkingv1alpha3.ClientTLSSettings_ISTIO_MUTUAL:
		common["tls_certificate_sds_secret_configs"] = []object{sdsSecretConfig(defaultSDSResource)}
		validation(rootSDSResource)
		alpn = []string{"istio", "h2"}
		if sniName == "" {
			sniName = sni
		}
	default:
		return nil
	}
	if h2 {
		common["alpn_protocols"] = alpn
	}
	ctx := object{"common_tls_context": common}
	ctx.set("sni", sniName)
	return object{
		"name":         "envoy.transport_sockets.tls",
		"typed_config": typed("envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext", ctx),
	}
}

// sdsSecretConfig asks the agent's SDS server (cluster sds-grpc) for a secret; the workload's own
// ("default", "ROOTCA") without waiting for it at start. nil for no name.
func sdsSecretConfig(name string) object {
	if name == "" {
		return nil
	}
	src := object{
		"api_config_source": object{
			"api_type":                       "GRPC",
			"set_node_on_first_message_only": true,
			"transport_api_version":          "V3",
			"grpc_services":                  []object{envoyGRPC(sdsCluster)},
		},
		"resource_api_version": "V3",
	}
	if name == defaultSDSResource || name == rootSDSResource {
		src["initial_fetch_timeout"] = duration(0)
	}
	return object{"name": name, "sds_config": src}
}

func exactMatchers(names []string) []object {
	var out []object
	for _, n := range names {
		out = append(out, object{"exact": n})
	}
	return out
}

// writeLightstepToken writes ProxyConfig.tracing.lightstep.accessToken where the lightstep tracer
// reads it (<ConfigPath>/lightstep_access_token.txt), as Istio's agent does before rendering.
func writeLightstepToken(c Config) error {
	ls := c.Proxy.GetTracing().GetLightstep()
	if ls == nil {
		return nil
	}
	//nolint:staticcheck // Istio still reads the deprecated lightstep settings.
	return writeAtomic(filepath.Join(c.ConfigPath, lightstepTokenFile), []byte(ls.GetAccessToken()))
}
