package envoy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"text/template"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
)

// renderTemplateFile renders a user bootstrap template (ISTIO_BOOTSTRAP, --templateFile or
// ProxyConfig.proxyBootstrapTemplatePath) with Istio-compatible parameters and checks that the result
// is a Bootstrap. Every error names the template file.
//
// Supported parameters (Istio's names): nodeID, cluster, region, zone, sub_zone, meta_json_str,
// runtime_flags (JSON object), xds_type, localhost, wildcard, additional_wildcard, dual_stack,
// dns_lookup_family, envoy_status_port, envoy_prometheus_port, config (the ProxyConfig, with
// ConfigPath, ProxyAdminPort and StatusPort as this agent uses them), discovery_address,
// pilot_grpc_address, discovery_host, extraStatTags, inclusionPrefix, inclusionSuffix,
// inclusionRegexps, histogram_buckets, stats_compression, metadata_discovery, outlier_log_path,
// sts_port, zipkin (a socket_address JSON object) and, new here, xds_socket and sds_socket.
// Functions: Go's text/template built-ins (js, printf, ...) and toJson. Not supported: the other sprig
// functions, lightstep/datadog/stackdriver/opencensus, metrics and access log services, statsd.
func renderTemplateFile(path string, c BootstrapConfig) ([]byte, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bootstrap template: %w", err)
	}
	tmpl, err := template.New(path).Funcs(template.FuncMap{"toJson": toJSON}).Option("missingkey=zero").Parse(string(text))
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

// templateParams computes the values Istio passes to its bootstrap template.
func templateParams(c BootstrapConfig) (map[string]any, error) {
	node, err := buildNode(c)
	if err != nil {
		return nil, err
	}
	fam := ipFamilyFor(c.InstanceIPs, c.DualStack)
	stats := getStatsOptions(c, node)
	runtime, _, err := runtimeFlags(c, node)
	if err != nil {
		return nil, err
	}
	meta, err := protojson.Marshal(node.metadata)
	if err != nil {
		return nil, err
	}
	flags, err := protojson.Marshal(runtime)
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
	discHost, _, _ := net.SplitHostPort(discovery)
	buckets := make([]map[string]any, 0, len(stats.buckets))
	for _, b := range stats.buckets {
		buckets = append(buckets, map[string]any{"match": map[string]any{"prefix": b.GetMatch().GetPrefix()}, "buckets": b.GetBuckets()})
	}
	p := map[string]any{
		"nodeID":                node.id,
		"cluster":               node.cluster,
		"region":                node.locality.GetRegion(),
		"zone":                  node.locality.GetZone(),
		"sub_zone":              node.locality.GetSubZone(),
		"meta_json_str":         string(meta),
		"runtime_flags":         string(flags),
		"xds_type":              xdsType,
		"localhost":             fam.localhost,
		"wildcard":              fam.wildcard,
		"additional_wildcard":   fam.additionalWildcard,
		"dual_stack":            fam.additionalWildcard != "",
		"dns_lookup_family":     fam.lookup.String(),
		"envoy_status_port":     c.EnvoyStatusPort,
		"envoy_prometheus_port": c.EnvoyPrometheusPort,
		"config":                pc,
		"discovery_address":     discovery,
		"pilot_grpc_address":    discovery,
		"discovery_host":        discHost,
		"extraStatTags":         stats.extraTags,
		"inclusionPrefix":       stats.prefixes,
		"inclusionSuffix":       stats.suffixes,
		"inclusionRegexps":      stats.regexp,
		"stats_compression":     node.annotations[annoStatsCompression],
		"metadata_discovery":    c.metadataDiscoveryExtension(node),
		"outlier_log_path":      c.OutlierLogPath,
		"xds_socket":            c.XDSSocket,
		"sds_socket":            c.SDSSocket,
	}
	if len(buckets) > 0 {
		p["histogram_buckets"] = buckets
	}
	if c.STSPort > 0 {
		p["sts_port"] = c.STSPort
	}
	if addr := pc.GetTracing().GetZipkin().GetAddress(); addr != "" {
		host, port, err := net.SplitHostPort(addr)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil {
			return nil, fmt.Errorf("ProxyConfig.tracing.zipkin.address %q: want host:port", addr)
		}
		js, _ := json.Marshal(map[string]any{"address": host, "port_value": n})
		p["zipkin"] = string(js)
	}
	return p, nil
}

// toJSON is sprig's toJson: the value as JSON, "" if it cannot be marshalled.
func toJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}
