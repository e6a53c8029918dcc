package bootstrap

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/services/internal/unique"
)

// Environment prefixes that Istio copies into the Envoy node metadata.
const (
	metaPrefix     = "ISTIO_META_"     // ISTIO_META_<K>=v  ⇒ metadata <K>: "v"
	metaJSONPrefix = "ISTIO_METAJSON_" // ISTIO_METAJSON_<K>={...} ⇒ the object's keys merged into metadata

	// podTemplateHashLabel is added by the Deployment controller to every pod; Istio drops it from LABELS
	// so that a rollout does not look like a different workload.
	podTemplateHashLabel = "pod-template-hash"
	// localityLabel carries region.zone.subzone (Istio's istio-locality label);
	// topologyLocalityLabel, when present, wins over it.
	localityLabel         = "istio-locality"
	topologyLocalityLabel = "topology.istio.io/locality"
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
// <app label>.<ns> (app, app.kubernetes.io/name or service.istio.io/canonical-name), then
// <workload>.<ns>, then istio-proxy.<ns>, then istio-proxy.
func ServiceCluster(explicit string, pc *meshv1alpha1.ProxyConfig, labels map[string]string, workload, namespace string) string {
	orDefault := func(name string) string {
		if name != "" && name != "istio-proxy" {
			return name
		}
		// Istio's labels.GetApp order: app first, for clusters named before the others existed.
		for _, k := range []string{"app", "app.kubernetes.io/name", "service.istio.io/canonical-name"} {
			if app, ok := labels[k]; ok {
				return app + "." + namespace
			}
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
	b, err := boundedfile.Read(path, boundedfile.MaxConfig)
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
func (c Config) Node() (*corev3.Node, error) {
	n, err := buildNode(c)
	if err != nil {
		return nil, err
	}
	return n.proto(), nil
}

// nodeInfo is what the bootstrap needs to know about the pod, derived once from Config.
type nodeInfo struct {
	id          string
	cluster     string
	locality    *corev3.Locality
	metadata    *structpb.Struct
	raw         map[string]any // the ISTIO_META_* / ISTIO_METAJSON_* values after Istio's typed pass, for options read from metadata
	labels      map[string]string
	annotations map[string]string
}

// buildNode derives the node (id, cluster, locality, metadata) the way Istio's GetNodeMetaData and
// ConvertNodeToXDSNode do: the raw ISTIO_META_* / ISTIO_METAJSON_* values, through Istio's typed
// pass (metadata.go), then the agent's own keys on top.
func buildNode(c Config) (nodeInfo, error) {
	raw, staticLabels := c.rawMetadata()
	meta := make(map[string]any, len(raw)+16)
	for k, v := range raw {
		meta[k] = v
	}
	if err := normalizeTypedMetadata(meta); err != nil {
		return nodeInfo{}, err
	}
	typed := maps.Clone(meta)

	// LABELS: ISTIO_METAJSON_LABELS (also STATIC_LABELS), then, when the Downward API file exists,
	// a fresh map of those and the file's labels minus pod-template-hash.
	labels := stringMap(meta["LABELS"])
	static := stringMap(meta["STATIC_LABELS"])
	if staticLabels != nil {
		labels, static = staticLabels, staticLabels
	}
	fileLabels, err := ReadDownwardAPI(c.LabelsFile)
	if err != nil {
		return nodeInfo{}, fmt.Errorf("labels file: %w", err)
	}
	if fileLabels != nil {
		labels = map[string]string{}
		for k, v := range static {
			labels[k] = v
		}
		for k, v := range fileLabels {
			if k != podTemplateHashLabel {
				labels[k] = v
			}
		}
	}
	annotations := stringMap(meta["ANNOTATIONS"])
	fileAnnotations, err := ReadDownwardAPI(c.AnnotationsFile)
	if err != nil {
		return nodeInfo{}, fmt.Errorf("annotations file: %w", err)
	}
	if fileAnnotations != nil {
		if annotations == nil {
			annotations = map[string]string{}
		}
		for k, v := range fileAnnotations {
			annotations[k] = v
		}
	}

	// Locality: topology.istio.io/locality, else istio-locality (region.zone.subzone, written back
	// with '/' under istio-locality), else the platform's.
	locality := &corev3.Locality{}
	loc, ok := labels[topologyLocalityLabel]
	if !ok {
		loc = labels[localityLabel]
	}
	if loc != "" {
		if !strings.Contains(loc, "/") {
			loc = strings.ReplaceAll(loc, ".", "/")
		}
		labels[localityLabel] = loc
		parts := strings.Split(loc, "/")
		locality.Region = parts[0]
		if len(parts) > 1 {
			locality.Zone = parts[1]
		}
		if len(parts) > 2 {
			locality.SubZone = parts[2]
		}
	} else if c.Platform.Zone != "" {
		locality = c.Platform.locality()
	}

	// The agent's own keys: written when not empty, else the raw value stays.
	set := func(key string, val any, write bool) {
		if write {
			meta[key] = val
		}
	}
	if v, _ := meta["ISTIO_VERSION"].(string); v == "" {
		set("ISTIO_VERSION", c.IstioVersion, c.IstioVersion != "")
	}
	set("NAME", c.PodName, c.PodName != "")
	set("NAMESPACE", c.PodNamespace, c.PodNamespace != "")
	set("SERVICE_ACCOUNT", c.ServiceAccount, c.ServiceAccount != "")
	ips := unique.Values(c.InstanceIPs)
	set("INSTANCE_IPS", strings.Join(ips, ","), len(ips) > 0)
	set("LABELS", stringMapToAny(labels), len(labels) > 0)
	set("STATIC_LABELS", stringMapToAny(static), len(static) > 0)
	set("ANNOTATIONS", stringMapToAny(annotations), len(annotations) > 0)
	set("PLATFORM_METADATA", stringMapToAny(c.Platform.Metadata), len(c.Platform.Metadata) > 0)
	san := c.pilotSAN()
	set("PILOT_SAN", stringsToAny(san), len(san) > 0)
	set("OUTLIER_LOG_PATH", c.OutlierLogPath, c.OutlierLogPath != "")
	set("STS_PORT", strconv.Itoa(c.STSPort), c.STSPort > 0)
	set("ENVOY_STATUS_PORT", c.EnvoyStatusPort, c.EnvoyStatusPort != 0)
	set("ENVOY_PROMETHEUS_PORT", c.EnvoyPrometheusPort, c.EnvoyPrometheusPort != 0)
	set("ENVOY_SECURE_METRICS_PORT", c.SecureMetricsPort, c.SecureMetricsPort != 0)
	set("ENVOY_SECURE_MERGED_METRICS_PORT", c.SecureMergedMetricsPort, c.SecureMergedMetricsPort != 0)
	set("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "true", c.ExitOnZeroActiveConnections)
	set("METADATA_DISCOVERY", strconv.FormatBool(c.metadataDiscovery(meta)), true)
	set("ENVOY_SKIP_DEPRECATED_LOGS", "true", c.SkipDeprecatedLogs)
	set("WORKLOAD_IDENTITY_SOCKET_FILE", c.WorkloadIdentitySocketFile, c.WorkloadIdentitySocketFile != "")
	set("credential", "true", c.CredentialSocketExists)
	set("file-credential", "true", c.FilesSDSSocket != "")
	md, err := structpb.NewStruct(meta)
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

	workload, _ := meta["WORKLOAD_NAME"].(string)
	return nodeInfo{
		id:          NodeID(c.ProxyType, c.InstanceIPs, c.PodName, c.PodNamespace, c.Domain),
		cluster:     ServiceCluster(c.ServiceCluster, c.Proxy, labels, workload, c.PodNamespace),
		locality:    locality,
		metadata:    md,
		raw:         typed,
		labels:      labels,
		annotations: annotations,
	}, nil
}

func (n nodeInfo) proto() *corev3.Node {
	return &corev3.Node{Id: n.id, Cluster: n.cluster, Locality: n.locality, Metadata: n.metadata}
}

// bootstrapJSON is the node as the bootstrap's node field. Node is a small type, which the agent
// marshals anyway for proxyless gRPC clients' bootstrap: this costs little of what marshalling the
// whole Bootstrap would (json.go).
func (n nodeInfo) bootstrapJSON() (json.RawMessage, error) {
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(n.proto())
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	return js, nil
}

// rawMetadata is the metadata before Istio's typed pass: ProxyConfig.proxyMetadata's ISTIO_META_*
// entries, the environment's ISTIO_META_* (over them), each ISTIO_METAJSON_* object merged in, and
// DNS_PROXY_ADDR. It also returns ISTIO_METAJSON_LABELS as labels, nil when absent or empty.
func (c Config) rawMetadata() (map[string]any, map[string]string) {
	raw := map[string]any{}
	for k, v := range c.Proxy.GetProxyMetadata() {
		if key, ok := strings.CutPrefix(k, metaPrefix); ok {
			raw[key] = v
		}
	}
	for _, e := range c.Env {
		name, val, ok := strings.Cut(e, "=")
		if !ok {
			continue
		}
		if key, ok := strings.CutPrefix(name, metaPrefix); ok {
			raw[key] = val
		}
	}
	var staticLabels map[string]string
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
	// Not ISTIO_META_*, but Istio's agent copies it from its environment all the same.
	if c.DNSProxyAddr != "" {
		raw["DNS_PROXY_ADDR"] = c.DNSProxyAddr
	}
	return raw, staticLabels
}

// stringMap is a metadata object of strings as a map (nil values dropped); nil if v is not one.
func stringMap(v any) map[string]string {
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, x := range m {
		if s, ok := x.(string); ok {
			out[k] = s
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
