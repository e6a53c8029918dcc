package envoy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
)

// Environment prefixes that Istio copies into the Envoy node metadata.
const (
	metaPrefix     = "ISTIO_META_"     // ISTIO_META_<K>=v  ⇒ metadata <K>: "v"
	metaJSONPrefix = "ISTIO_METAJSON_" // ISTIO_METAJSON_<K>={...} ⇒ the object's keys merged into metadata

	// podTemplateHashLabel is added by the Deployment controller to every pod; Istio drops it from LABELS
	// so that a rollout does not look like a different workload.
	podTemplateHashLabel = "pod-template-hash"
	// localityLabel carries region.zone.subzone (Istio's istio-locality label).
	localityLabel = "istio-locality"
)

// NodeID builds Envoy's node id the way Istio's agent does:
// <proxyType>~<first IP>~<podName>.<podNamespace>~<domain>, for example
// sidecar~10.1.2.3~app-x.ns~ns.svc.cluster.local. An empty domain becomes DefaultDomain(podNamespace)
// (the default of pilot-agent's --domain flag).
func NodeID(proxyType string, ips []string, podName, podNamespace, domain string) string {
	ip := ""
	if len(ips) > 0 {
		ip = ips[0]
	}
	if domain == "" {
		domain = DefaultDomain(podNamespace)
	}
	return proxyType + "~" + ip + "~" + podName + "." + podNamespace + "~" + domain
}

// DefaultDomain is the default of pilot-agent's --domain: <namespace>.svc.cluster.local.
func DefaultDomain(podNamespace string) string {
	return podNamespace + ".svc.cluster.local"
}

// AllIPv4 reports whether every address parses as IPv4 (an empty list counts as IPv4, as in Istio).
func AllIPv4(ips []string) bool {
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Unmap().Is4() {
			return false
		}
	}
	return true
}

// AllIPv6 reports whether the list is non-empty and every address parses as IPv6 (Istio's rule for
// --local-address-ip-version v6 and for ::1/:: in the bootstrap).
func AllIPv6(ips []string) bool {
	if len(ips) == 0 {
		return false
	}
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is6() || a.Is4In6() {
			return false
		}
	}
	return true
}

// ServiceCluster is node.cluster, by Istio's rules: an explicit service cluster other than "istio-proxy"
// wins; tracingServiceName modes pick the app label or the canonical service name; otherwise
// <app label>.<ns>, then <workload>.<ns>, then istio-proxy.<ns>, then istio-proxy.
func ServiceCluster(explicit string, pc *meshv1alpha1.ProxyConfig, labels map[string]string, workload, namespace string) string {
	orDefault := func(name string) string {
		if name != "" && name != "istio-proxy" {
			return name
		}
		if app, ok := labels["app"]; ok {
			return app + "." + namespace
		}
		if workload != "" {
			return workload + "." + namespace
		}
		if namespace != "" {
			return "istio-proxy." + namespace
		}
		return "istio-proxy"
	}
	if explicit != "" {
		return orDefault(explicit)
	}
	switch name := pc.GetClusterName().(type) {
	case *meshv1alpha1.ProxyConfig_ServiceCluster:
		return orDefault(name.ServiceCluster)
	case *meshv1alpha1.ProxyConfig_TracingServiceName_:
		if workload == "" {
			workload = "istio-proxy"
		}
		switch name.TracingServiceName {
		case meshv1alpha1.ProxyConfig_CANONICAL_NAME_ONLY:
			return orDefault(canonicalService(labels, workload))
		case meshv1alpha1.ProxyConfig_CANONICAL_NAME_AND_NAMESPACE:
			cs := canonicalService(labels, workload)
			if namespace != "" {
				return cs + "." + namespace
			}
			return orDefault(cs)
		}
	}
	return orDefault("istio-proxy")
}

// canonicalService follows Istio's label precedence for the canonical service name.
func canonicalService(labels map[string]string, workload string) string {
	for _, k := range []string{"service.istio.io/canonical-name", "app.kubernetes.io/name", "app"} {
		if v := labels[k]; v != "" {
			return v
		}
	}
	return workload
}

// ParseDownwardAPI parses a Kubernetes Downward API file (lines of key="quoted value"); lines without
// '=' are skipped, a value that is not a quoted string is an error.
func ParseDownwardAPI(text string) (map[string]string, error) {
	out := map[string]string{}
	for line := range strings.SplitSeq(text, "\n") {
		key, quoted, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		val, err := strconv.Unquote(quoted)
		if err != nil {
			return nil, fmt.Errorf("line %q: value is not a quoted string: %w", line, err)
		}
		out[key] = val
	}
	return out, nil
}

// ReadDownwardAPI reads a Downward API file; a missing file (not running on Kubernetes) is not an error.
func ReadDownwardAPI(path string) (map[string]string, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	m, err := ParseDownwardAPI(string(b))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return m, nil
}

// Node is the node Envoy announces to the control plane (id, cluster,
// locality, metadata), as the bootstrap carries it: what the XDS proxy and
// proxyless gRPC clients announce too.
func (c BootstrapConfig) Node() (*corev3.Node, error) {
	n, err := buildNode(c)
	if err != nil {
		return nil, err
	}
	return &corev3.Node{Id: n.id, Cluster: n.cluster, Locality: n.locality, Metadata: n.metadata}, nil
}

// nodeInfo is what the bootstrap needs to know about the pod, derived once from BootstrapConfig.
type nodeInfo struct {
	id          string
	cluster     string
	locality    *corev3.Locality
	metadata    *structpb.Struct
	raw         map[string]any // the ISTIO_META_* / ISTIO_METAJSON_* values, for options read from metadata
	labels      map[string]string
	annotations map[string]string
}

// buildNode derives the node (id, cluster, locality, metadata) the way Istio's GetNodeMetaData and
// ConvertNodeToXDSNode do: raw ISTIO_META_* / ISTIO_METAJSON_* values first, then the agent's typed
// keys on top.
func buildNode(c BootstrapConfig) (nodeInfo, error) {
	raw := map[string]any{}
	for k, v := range c.Proxy.GetProxyMetadata() {
		if key, ok := strings.CutPrefix(k, metaPrefix); ok {
			raw[key] = v
		}
	}
	var staticLabels map[string]string
	for _, e := range c.Env {
		name, val, ok := strings.Cut(e, "=")
		if !ok {
			continue
		}
		if key, ok := strings.CutPrefix(name, metaPrefix); ok {
			raw[key] = val
		}
	}
	for _, e := range c.Env {
		name, val, ok := strings.Cut(e, "=")
		if !ok || !strings.HasPrefix(name, metaJSONPrefix) {
			continue
		}
		// Istio merges the object's keys into the metadata and ignores a value that is not JSON.
		_ = json.Unmarshal([]byte(val), &raw)
		if name == metaJSONPrefix+"LABELS" {
			var m map[string]string
			if json.Unmarshal([]byte(val), &m) == nil && len(m) > 0 {
				staticLabels = m
			}
		}
	}

	fileLabels, err := ReadDownwardAPI(c.LabelsFile)
	if err != nil {
		return nodeInfo{}, fmt.Errorf("labels file: %w", err)
	}
	labels := map[string]string{}
	for k, v := range staticLabels {
		labels[k] = v
	}
	for k, v := range fileLabels {
		if k != podTemplateHashLabel {
			labels[k] = v
		}
	}
	annotations, err := ReadDownwardAPI(c.AnnotationsFile)
	if err != nil {
		return nodeInfo{}, fmt.Errorf("annotations file: %w", err)
	}

	// istio-locality is region.zone.subzone; Istio rewrites it with '/' in LABELS.
	var locality *corev3.Locality
	if l := strings.ReplaceAll(labels[localityLabel], ".", "/"); l != "" {
		labels[localityLabel] = l
		parts := strings.SplitN(l, "/", 3)
		locality = &corev3.Locality{Region: parts[0]}
		if len(parts) > 1 {
			locality.Zone = parts[1]
		}
		if len(parts) > 2 {
			locality.SubZone = parts[2]
		}
	} else {
		locality = &corev3.Locality{}
	}

	typed := map[string]any{}
	for k, v := range raw {
		typed[k] = v
	}
	setIf := func(key, val string) {
		if val != "" {
			typed[key] = val
		}
	}
	if _, ok := raw["ISTIO_VERSION"]; !ok {
		setIf("ISTIO_VERSION", c.IstioVersion)
	}
	setIf("NAME", c.PodName)
	setIf("NAMESPACE", c.PodNamespace)
	setIf("SERVICE_ACCOUNT", c.ServiceAccount)
	if ips := dedupe(c.InstanceIPs); len(ips) > 0 {
		typed["INSTANCE_IPS"] = strings.Join(ips, ",")
	}
	if len(labels) > 0 || staticLabels != nil || fileLabels != nil {
		typed["LABELS"] = stringMapToAny(labels)
	}
	if annotations != nil {
		typed["ANNOTATIONS"] = stringMapToAny(annotations)
	}
	if san := c.pilotSAN(); len(san) > 0 {
		typed["PILOT_SAN"] = stringsToAny(san)
	}
	setIf("OUTLIER_LOG_PATH", c.OutlierLogPath)
	setIf("DNS_PROXY_ADDR", c.DNSProxyAddr)
	typed["ENVOY_STATUS_PORT"] = c.EnvoyStatusPort
	typed["ENVOY_PROMETHEUS_PORT"] = c.EnvoyPrometheusPort
	if c.ExitOnZeroActiveConnections {
		typed["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"] = "true"
	}
	typed["METADATA_DISCOVERY"] = strconv.FormatBool(c.metadataDiscovery(raw))
	if c.STSPort > 0 {
		typed["STS_PORT"] = strconv.Itoa(c.STSPort)
	}
	if c.CredentialSocketExists {
		typed["credential"] = "true"
	}
	md, err := structpb.NewStruct(typed)
	if err != nil {
		return nodeInfo{}, fmt.Errorf("node metadata: %w", err)
	}
	if c.Proxy != nil {
		// PROXY_CONFIG is the ProxyConfig in its proto-JSON form (camelCase), as Istio sends it.
		js, err := protojson.Marshal(c.Proxy)
		if err != nil {
			return nodeInfo{}, fmt.Errorf("node metadata PROXY_CONFIG: %w", err)
		}
		pcv := &structpb.Struct{}
		if err := protojson.Unmarshal(js, pcv); err != nil {
			return nodeInfo{}, fmt.Errorf("node metadata PROXY_CONFIG: %w", err)
		}
		md.Fields["PROXY_CONFIG"] = structpb.NewStructValue(pcv)
	}

	workload, _ := raw["WORKLOAD_NAME"].(string)
	return nodeInfo{
		id:          NodeID(c.ProxyType, c.InstanceIPs, c.PodName, c.PodNamespace, c.Domain),
		cluster:     ServiceCluster(c.ServiceCluster, c.Proxy, labels, workload, c.PodNamespace),
		locality:    locality,
		metadata:    md,
		raw:         raw,
		labels:      labels,
		annotations: annotations,
	}, nil
}

func dedupe(values []string) []string {
	out := make([]string, 0, len(values))
	for _, v := range values {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

func stringMapToAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func stringsToAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
