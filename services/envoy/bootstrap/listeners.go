package bootstrap

import "strconv"

// statsContentTypes are the responses the :15090 listener compresses (Prometheus' text and
// protobuf formats, OpenMetrics').
var statsContentTypes = []string{"text/plain", "application/vnd.google.protobuf", "application/openmetrics-text", "application/openmetrics-protobuf"}

// metricsListener serves Envoy's Prometheus stats on <wildcard>:15090 (localhost only with
// METRICS_LOCALHOST_ACCESS_ONLY), compressed (brotli, zstd or gzip, as the client accepts) unless
// statsCompression is off.
func metricsListener(c Config, fam ipFamily, compress bool) object {
	host, extra := fam.wildcard, fam.additionalWildcard
	if c.MetricsLocalhostOnly {
		host, extra = fam.localhost, fam.additionalLocalhost
	}
	var filters []object
	if compress {
		for _, lib := range []struct{ name, message string }{
			{"brotli", "envoy.extensions.compression.brotli.compressor.v3.Brotli"},
			{"zstd", "envoy.extensions.compression.zstd.compressor.v3.Zstd"},
			{"gzip", "envoy.extensions.compression.gzip.compressor.v3.Gzip"},
		} {
			filters = append(filters, httpFilter("envoy.filters.http.compressor."+lib.name, typed("envoy.extensions.filters.http.compressor.v3.Compressor", object{
				"compressor_library":        object{"name": "stats_" + lib.name, "typed_config": typed(lib.message, nil)},
				"response_direction_config": object{"common_config": object{"content_type": statsContentTypes}},
			})))
		}
	}
	return httpListener(host, extra, c.EnvoyPrometheusPort, "stats", routesTo(statsCluster, "/stats/prometheus"), filters)
}

// ReadinessKey is the runtime key (Envoy's admin layer, POST /runtime_modify) through which the
// agent tells Envoy it is ready: 100 while it is, 0 or absent while it is not (#36).
const ReadinessKey = "meshagent.agent_ready"

// healthListener serves /healthz/ready on <wildcard>:15021, the port the kubelet probes (Istio's
// injected readiness and startup probes), so that readiness also proves Envoy is serving: Envoy
// accepts on the listener only once its workers have started, after the first CDS and LDS.
//
// As in Istio's bootstrap the request is forwarded to the agent's status port. With
// EnvoyAnswersReadiness, a route before that one answers 200 from Envoy itself while the agent
// has set ReadinessKey to 100 (runtime_fraction, default 0: a fresh Envoy, or a new hot restart
// epoch, asks the agent until told). A probe a second was the largest part of the agent's idle
// CPU: each woke the agent's runtime for ~0.3 ms (docs/performance.md, #36). Envoy's health check
// filter would answer as cheaply, but the agent could only turn it off through
// /healthcheck/fail, which also makes Envoy drain-close every connection of its listeners.
//
// With ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL it accepts requests behind a PROXY protocol header
// too.
func healthListener(c Config, fam ipFamily) object {
	routes := routesTo(agentCluster, "/healthz/ready")
	if c.ReadinessInEnvoy() {
		routes = append([]object{{
			"match": object{
				"prefix": "/healthz/ready",
				"runtime_fraction": object{
					"default_value": object{"numerator": 0, "denominator": "HUNDRED"},
					"runtime_key":   ReadinessKey,
				},
			},
			"direct_response": object{"status": 200, "body": object{"inline_string": "ready\n"}},
		}}, routes...)
	}
	l := httpListener(fam.wildcard, fam.additionalWildcard, c.EnvoyStatusPort, "agent", routes, nil)
	if c.StatusPortProxyProtocol {
		l["listener_filters"] = []object{{
			"name": "envoy.listener.proxy_protocol",
			"typed_config": typed("envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol", object{
				"allow_requests_without_proxy_protocol": true,
			}),
		}}
	}
	return l
}

// secureMetricsListener serves metrics over mTLS on <wildcard>:port with the workload certificate
// (SDS default and ROOTCA), clients must present one (ENVOY_SECURE_METRICS_PORT: Envoy's stats;
// ENVOY_SECURE_MERGED_METRICS_PORT: the agent's merged metrics).
func secureMetricsListener(fam ipFamily, port int, statPrefix, cluster string, prefixes ...string) object {
	l := httpListener(fam.wildcard, "", port, statPrefix, routesTo(cluster, prefixes...), nil)
	l["listener_filters"] = []object{{
		"name":         "envoy.filters.listener.tls_inspector",
		"typed_config": typed("envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector", nil),
	}}
	secret := func(name string) object {
		s := sdsSecretConfig(name)
		delete(s["sds_config"].(object), "initial_fetch_timeout") // Istio's template waits for these
		return s
	}
	fc := l["filter_chains"].([]object)[0]
	fc["filter_chain_match"] = object{"transport_protocol": "tls"}
	fc["transport_socket"] = object{
		"name": "envoy.transport_sockets.tls",
		"typed_config": typed("envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext", object{
			"require_client_certificate": true,
			"common_tls_context": object{
				"tls_certificate_sds_secret_configs": []object{secret(defaultSDSResource)},
				"combined_validation_context": object{
					"default_validation_context":           object{},
					"validation_context_sds_secret_config": secret(rootSDSResource),
				},
			},
		}),
	}
	return l
}

// routesTo routes each path prefix to cluster.
func routesTo(cluster string, prefixes ...string) []object {
	var routes []object
	for _, prefix := range prefixes {
		routes = append(routes, object{"match": object{"prefix": prefix}, "route": object{"cluster": cluster}})
	}
	return routes
}

// httpListener is a static listener with an inline route table. These listeners are the agent's
// own: they ignore the global connection limit and the overload manager.
func httpListener(host, additional string, port int, statPrefix string, routes, filters []object) object {
	hcm := typed("envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager", object{
		"stat_prefix": statPrefix,
		"route_config": object{
			"virtual_hosts": []object{{"name": "backend", "domains": []string{"*"}, "routes": routes}},
		},
		"http_filters": append(filters, httpFilter("envoy.filters.http.router", typed("envoy.extensions.filters.http.router.v3.Router", nil))),
	})
	l := object{
		"name":    host + "_" + strconv.Itoa(port), // Envoy's listener stat form: 0.0.0.0_15090
		"address": socketAddress(host, port),
		"filter_chains": []object{{"filters": []object{{
			"name":         "envoy.filters.network.http_connection_manager",
			"typed_config": hcm,
		}}}},
		"ignore_global_conn_limit": true,
		"bypass_overload_manager":  true,
	}
	if additional != "" {
		l["additional_addresses"] = []object{{"address": socketAddress(additional, port)}}
	}
	return l
}

func httpFilter(name string, config object) object {
	return object{"name": name, "typed_config": config}
}

// devNullAccessLog discards the admin interface's access log, as Istio does.
func devNullAccessLog() object {
	return object{
		"name":         "envoy.access_loggers.file",
		"typed_config": typed("envoy.extensions.access_loggers.file.v3.FileAccessLog", object{"path": "/dev/null"}),
	}
}
