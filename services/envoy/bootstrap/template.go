package bootstrap

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	"github.com/Masterminds/sprig/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/services/internal/boundedfile"
)

// renderTemplateFile renders a user bootstrap template (ISTIO_BOOTSTRAP, --templateFile or
// ProxyConfig.proxyBootstrapTemplatePath) as Istio's agent does, and checks that the result is a
// Bootstrap Envoy can load. Every error names the template file. Istio's own template
// (tools/packaging/common/envoy_bootstrap.json) renders to the built-in bootstrap, field for
// field but for the differences docs/conformance.md lists (a test compares them).
//
// The functions are Istio's: Go's text/template built-ins, sprig's generic functions
// (github.com/Masterminds/sprig/v3: default, toJson, quote, ...) and toJSON. The parameters are
// Istio's, by name and type (pkg/bootstrap/option): see templateParams. Two are not quite Istio's:
// metadata is the node metadata as a JSON object (Istio passes its Go struct, whose field names
// no template should depend on), and meshagent adds xds_socket and sds_socket, the unix sockets
// under --root.
func renderTemplateFile(path string, c Config) ([]byte, error) {
	text, err := boundedfile.Read(path, boundedfile.MaxConfig)
	if err != nil {
		return nil, fmt.Errorf("bootstrap template: %w", err)
	}
	tmpl, err := template.New(filepath.Base(path)).Funcs(template.FuncMap{"toJSON": toJSON}).Funcs(sprig.GenericFuncMap()).Parse(string(text))
	if err != nil {
		return nil, fmt.Errorf("bootstrap template %s: %w", path, err)
	}
	params, err := templateParams(c)
	if err != nil {
		return nil, fmt.Errorf("bootstrap template %s: %w", path, err)
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, params); err != nil {
		return nil, fmt.Errorf("bootstrap template %s: %w", path, err)
	}
	if _, err := parseBootstrap(buf.Bytes()); err != nil {
		return nil, fmt.Errorf("bootstrap template %s: rendered result is not a valid Envoy bootstrap: %w", path, err)
	}
	return buf.Bytes(), nil
}

// templateParams are the values Istio's agent passes to its bootstrap template, under Istio's
// names and with the Go types its templates print (pkg/bootstrap/config.go toTemplateParams,
// pkg/bootstrap/option): a parameter Istio skips when empty is left out here too, so that
// {{ if .x }} reads the same.
func templateParams(c Config) (map[string]any, error) {
	node, err := buildNode(c)
	if err != nil {
		return nil, err
	}
	fam := ipFamilyFor(c.InstanceIPs, c.DualStack)
	stats := getStatsOptions(c, node)
	runtime, maxConn, err := runtimeFlags(c)
	if err != nil {
		return nil, err
	}
	meta, err := protojson.Marshal(node.metadata)
	if err != nil {
		return nil, err
	}
	var metaMap map[string]any
	if err := json.Unmarshal(meta, &metaMap); err != nil {
		return nil, err
	}
	flags, err := json.Marshal(runtime)
	if err != nil {
		return nil, err
	}
	xdsType := "GRPC"
	if c.DeltaXDS || c.ProxyType == "waypoint" {
		xdsType = "DELTA_GRPC"
	}
	pc := proto.Clone(c.Proxy).(*meshv1alpha1.ProxyConfig)
	pc.ConfigPath = c.ConfigPath
	pc.ProxyAdminPort = int32(c.AdminPort)
	pc.StatusPort = int32(c.StatusPort)
	discovery := pc.GetDiscoveryAddress()
	discHost, _, _ := strings.Cut(discovery, ":")
	var sans []string
	for _, s := range c.pilotSAN() {
		sans = append(sans, fmt.Sprintf(`{"exact":"%s"}`, s))
	}
	p := map[string]any{
		"nodeID":                            node.id,
		"nodeType":                          strings.Split(node.id, "~")[0],
		"cluster":                           node.cluster,
		"meta_json_str":                     string(meta),
		"metadata":                          metaMap,
		"runtime_flags":                     string(flags),
		"xds_type":                          xdsType,
		"localhost":                         fam.localhost,
		"wildcard":                          fam.wildcard,
		"dns_lookup_family":                 fam.lookup,
		"envoy_status_port":                 c.EnvoyStatusPort,
		"envoy_prometheus_port":             c.EnvoyPrometheusPort,
		"global_downstream_max_connections": int(maxConn),
		"config":                            pc,
		"discovery_address":                 discovery,
		"discovery_host":                    discHost,
		"xds_root_cert":                     "",
		"pilot_SAN":                         "[" + strings.Join(sans, ",") + "]",
		"log_json":                          c.LogAsJSON,
		"histogram_buckets":                 stats.buckets,
		"envoy_metrics_stats_compression":   stats.compression,
		"metadata_discovery":                c.metadataDiscoveryExtension(node),
		"metrics_localhost_access_only":     c.MetricsLocalhostOnly,
		"workload_identity_socket_file":     c.WorkloadIdentitySocketFile,
		"xds_socket":                        c.XDSSocket,
		"sds_socket":                        c.SDSSocket,
	}
	setIf := func(name string, v any, ok bool) {
		if ok {
			p[name] = v
		}
	}
	setIf("region", node.locality.GetRegion(), node.locality.GetRegion() != "")
	setIf("zone", node.locality.GetZone(), node.locality.GetZone() != "")
	setIf("sub_zone", node.locality.GetSubZone(), node.locality.GetSubZone() != "")
	if fam.additionalWildcard != "" {
		p["additional_localhost"], p["additional_wildcard"], p["dual_stack"] = fam.additionalLocalhost, fam.additionalWildcard, true
	}
	setIf("extraStatTags", stats.extraTags, len(stats.extraTags) > 0)
	setIf("inclusionPrefix", stats.prefixes, len(stats.prefixes) > 0)
	setIf("inclusionSuffix", stats.suffixes, len(stats.suffixes) > 0)
	setIf("inclusionRegexps", stats.regexp, len(stats.regexp) > 0)
	setIf("stats_flush_interval", stats.flushInterval, stats.flushInterval != 0)
	setIf("stats_eviction_interval", fmt.Sprintf("%ds", int64(stats.evictionInterval/time.Second)), stats.evictionInterval != 0)
	setIf("outlier_log_path", c.OutlierLogPath, c.OutlierLogPath != "")
	setIf("custom_file_path", c.FilesSDSSocket, c.FilesSDSSocket != "")
	setIf("secure_metrics_port", c.SecureMetricsPort, c.SecureMetricsPort != 0)
	setIf("secure_merged_metrics_port", c.SecureMergedMetricsPort, c.SecureMergedMetricsPort != 0)
	setIf("envoy_status_port_enable_proxy_protocol", true, c.StatusPortProxyProtocol)
	setIf("enable_self_discovery", true, node.raw["ENABLE_SELF_DISCOVERY"] == "true")
	setIf("gcp_project_number", c.Platform.Metadata["gcp_project_number"], c.Platform.Metadata["gcp_project_number"] != "")
	if c.STSPort > 0 {
		p["sts"], p["sts_port"] = true, c.STSPort
		setIf("gcp_project_id", c.Platform.Metadata["gcp_project"], c.Platform.Metadata["gcp_project"] != "")
	}
	if lrs, ok := node.raw["LOAD_STATS_CONFIG_JSON"].(string); ok {
		p["load_stats_config_json_str"] = lrs
	}

	// Addresses as Istio's addressConverter writes them: a socket_address JSON object.
	address := func(name, what, addr string) error {
		if addr == "" {
			return nil
		}
		host, port, err := c.serviceAddress(what, addr)
		if err != nil {
			return err
		}
		p[name] = fmt.Sprintf(`{"address": "%s", "port_value": %d}`, host, port)
		return nil
	}
	if err := address("pilot_grpc_address", "ProxyConfig.discoveryAddress", discovery); err != nil {
		return nil, err
	}
	if err := address("statsd", "ProxyConfig.statsdUdpAddress", pc.GetStatsdUdpAddress()); err != nil {
		return nil, err
	}
	socket := func(name string, v object) error {
		js, err := json.Marshal(v)
		if err != nil {
			return err
		}
		p[name] = string(js)
		return nil
	}
	if tr := pc.GetTracing(); tr != nil {
		h2 := false
		switch tracer := tr.GetTracer().(type) {
		case *meshv1alpha1.Tracing_Zipkin_:
			err = address("zipkin", "ProxyConfig.tracing.zipkin.address", tracer.Zipkin.GetAddress())
		case *meshv1alpha1.Tracing_Lightstep_:
			h2 = true
			err = address("lightstep", "ProxyConfig.tracing.lightstep.address", tracer.Lightstep.GetAddress())
			p["lightstepToken"] = filepath.Join(c.ConfigPath, lightstepTokenFile)
		case *meshv1alpha1.Tracing_Datadog_:
			err = address("datadog", "ProxyConfig.tracing.datadog.address", tracer.Datadog.GetAddress())
		}
		if err != nil {
			return nil, err
		}
		if ts := upstreamTLS(tr.GetTlsSettings(), tracerSNI, node.raw, h2); ts != nil {
			if err := socket("tracing_tls", ts); err != nil {
				return nil, err
			}
		}
	}
	for _, svc := range []struct {
		prefix, what, addr string
		tls, keepalive     object
	}{
		{"envoy_metrics_service", "ProxyConfig.envoyMetricsService.address", pc.GetEnvoyMetricsService().GetAddress(),
			upstreamTLS(pc.GetEnvoyMetricsService().GetTlsSettings(), metricsServiceName, node.raw, true), keepalive(pc.GetEnvoyMetricsService().GetTcpKeepalive())},
		{"envoy_accesslog_service", "ProxyConfig.envoyAccessLogService.address", pc.GetEnvoyAccessLogService().GetAddress(),
			upstreamTLS(pc.GetEnvoyAccessLogService().GetTlsSettings(), accessLogServiceName, node.raw, true), keepalive(pc.GetEnvoyAccessLogService().GetTcpKeepalive())},
	} {
		if svc.addr == "" {
			continue
		}
		if err := address(svc.prefix+"_address", svc.what, svc.addr); err != nil {
			return nil, err
		}
		if svc.tls != nil {
			if err := socket(svc.prefix+"_tls", svc.tls); err != nil {
				return nil, err
			}
		}
		// Istio writes the keepalive's numbers as {"value": n}, which Envoy cannot read; this
		// writes them as Envoy reads them.
		if svc.keepalive != nil {
			if err := socket(svc.prefix+"_tcp_keepalive", svc.keepalive); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// toJSON is Istio's toJSON template function: the value as JSON, "{}" for nil or what cannot be
// marshalled.
func toJSON(v any) string {
	if v == nil {
		return "{}"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "{}"
	}
	return string(b)
}
