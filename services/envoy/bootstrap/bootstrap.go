package bootstrap

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/meshagent/meshagent/services/internal/boundedfile"
)

// Config is everything the Envoy bootstrap needs, as plain values that cmd fills from flags,
// environment and the ProxyConfig. Paths are used as given (cmd has already applied --root).
type Config struct {
	ProxyType       string   // "sidecar", "router" or "waypoint" (pilot-agent proxy <type>)
	PodName         string   // POD_NAME
	PodNamespace    string   // POD_NAMESPACE
	ServiceAccount  string   // SERVICE_ACCOUNT
	InstanceIPs     []string // INSTANCE_IP first, then host IPs; the first is in the node id
	Domain          string   // --domain; "" ⇒ <PodNamespace>.svc.cluster.local
	ServiceCluster  string   // --serviceCluster; "" ⇒ ProxyConfig.clusterName rules
	IstioVersion    string   // ISTIO_VERSION metadata unless ISTIO_META_ISTIO_VERSION is set
	Proxy           *meshv1alpha1.ProxyConfig
	Env             []string // os.Environ() form; ISTIO_META_* and ISTIO_METAJSON_* become node metadata
	LabelsFile      string   // Downward API labels, ./etc/istio/pod/labels (missing file is fine)
	AnnotationsFile string   // Downward API annotations, ./etc/istio/pod/annotations

	ConfigPath string // directory for envoy-rev.json (ProxyConfig.configPath, ./etc/istio/proxy)
	XDSSocket  string // pipe of cluster xds-grpc, <ConfigPath>/XDS
	SDSSocket  string // pipe of cluster sds-grpc, ./var/run/secrets/workload-spiffe-uds/socket

	AdminPort           int // ProxyConfig.proxyAdminPort, 15000
	StatusPort          int // ProxyConfig.statusPort, 15020 (cluster "agent")
	EnvoyStatusPort     int // 15021 (listener forwarding /healthz/ready to the agent)
	EnvoyPrometheusPort int // 15090 (listener serving /stats/prometheus)

	IstioBootstrap   string // ISTIO_BOOTSTRAP: template path, beats everything
	CustomConfigFile string // ProxyConfig.customConfigFile if empty here: used as is, never rendered
	TemplateFile     string // --templateFile; "" ⇒ ProxyConfig.proxyBootstrapTemplatePath; "" ⇒ built-in
	OverrideFile     string // ISTIO_BOOTSTRAP_OVERRIDE: YAML/JSON passed to Envoy as --config-yaml
	HostIP           string // HOST_IP: replaces $(HOST_IP) in the override file

	DeltaXDS                    bool     // ISTIO_DELTA_XDS (default true): ADS api_type DELTA_GRPC, else GRPC
	DualStack                   bool     // ISTIO_DUAL_STACK: mixed v4/v6 IPs listen on both families
	LogAsJSON                   bool     // --log_as_json: JSON application_log_config
	MetricsLocalhostOnly        bool     // METRICS_LOCALHOST_ACCESS_ONLY: 15090 on localhost
	ExitOnZeroActiveConnections bool     // EXIT_ON_ZERO_ACTIVE_CONNECTIONS: keeps downstream_cx_active stats
	DNSProxyAddr                string   // DNS_PROXY_ADDR as set (Istio's agent copies it into the metadata, DNS proxy on or not; "" ⇒ omitted)
	PilotSAN                    []string // PILOT_SAN; nil ⇒ discovery host when controlPlaneAuthPolicy is MUTUAL_TLS
	OutlierLogPath              string   // OUTLIER_LOG_PATH metadata and cluster_manager outlier log
	STSPort                     int      // --stsPort (STS_PORT metadata when > 0)
	CredentialSocketExists      bool     // ./var/run/secrets/credential-uds/socket is a live socket ⇒ credential: "true"
	SkipDeprecatedLogs          bool     // ENVOY_SKIP_DEPRECATED_LOGS (default true): ENVOY_SKIP_DEPRECATED_LOGS metadata
	WorkloadIdentitySocketFile  string   // WORKLOAD_IDENTITY_SOCKET_FILE (default "socket"): metadata, template parameter
	SecureMetricsPort           int      // ENVOY_SECURE_METRICS_PORT: an mTLS listener for Envoy's stats (0: none)
	SecureMergedMetricsPort     int      // ENVOY_SECURE_MERGED_METRICS_PORT: an mTLS listener for the merged metrics (0: none)
	CompliancePolicy            string   // COMPLIANCE_POLICY: fips-140-2 limits Envoy's gRPC clients to TLS 1.2
	// KeepPathFragment is HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED=false: Istio then sets the
	// runtime flag http_strip_fragment_from_path_unsafe_if_disabled to "false".
	KeepPathFragment bool
	Platform         Platform // the cloud platform's metadata (CLOUD_PLATFORM): PLATFORM_METADATA, locality
	// FilesSDSSocket is the agent's file-only SDS socket when an external SDS server holds the
	// workload identity (WORKLOAD_IDENTITY_SOCKET_FILE): cluster sds-files-grpc; "" for none.
	FilesSDSSocket string
	// StatusPortProxyProtocol is ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL: the :15021 listener also
	// accepts requests behind a PROXY protocol header.
	StatusPortProxyProtocol bool
	// EnvoyAnswersReadiness is MESHAGENT_ENVOY_ANSWERS_READINESS (default true, #36): the :15021
	// listener answers /healthz/ready itself while the agent has said it is ready (ReadinessKey),
	// and forwards it to the agent otherwise, so that the kubelet's probes do not wake the agent.
	EnvoyAnswersReadiness bool
	// MetadataDiscovery is PEER_METADATA_DISCOVERY: nil when the variable is not set, and then
	// ISTIO_META_ENABLE_HBONE decides, as in Istio. It is the node's METADATA_DISCOVERY metadata and,
	// over delta xDS, adds the metadata_discovery extension (waypoints always have it).
	MetadataDiscovery *bool
}

// File is the bootstrap handed to Envoy: the file for -c and the override for --config-yaml.
type File struct {
	Path       string // file for -c
	ConfigYAML string // JSON of ISTIO_BOOTSTRAP_OVERRIDE for --config-yaml, "" if none
	Custom     bool   // Path is ProxyConfig.customConfigFile, used as is (not ours to delete)
}

// Output file names in ConfigPath (Istio's envoy-rev.json, envoy-rev.yaml for a YAML template).
const (
	outputJSON = "envoy-rev.json"
	outputYAML = "envoy-rev.yaml"
)

// ErrInvalidConfig marks a Config that Validate rejects.
var ErrInvalidConfig = errors.New("invalid bootstrap config")

// Validate checks the values a bootstrap cannot be built without; errors name the field and value.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	switch c.ProxyType {
	case "sidecar", "router", "waypoint":
	default:
		bad("ProxyType %q: want sidecar, router or waypoint", c.ProxyType)
	}
	if len(c.InstanceIPs) == 0 {
		bad("InstanceIPs is empty: the node id needs an IP (INSTANCE_IP)")
	}
	for _, ip := range c.InstanceIPs {
		if net.ParseIP(ip) == nil {
			bad("InstanceIPs: %q is not an IP address", ip)
		}
	}
	if c.Proxy == nil {
		bad("Proxy (ProxyConfig) is nil")
	}
	if c.ConfigPath == "" {
		bad("ConfigPath is empty")
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"AdminPort", c.AdminPort}, {"StatusPort", c.StatusPort}, {"EnvoyStatusPort", c.EnvoyStatusPort}, {"EnvoyPrometheusPort", c.EnvoyPrometheusPort}} {
		if p.v < 1 || p.v > 65535 {
			bad("%s %d: want 1-65535", p.name, p.v)
		}
	}
	if c.customConfigFile() == "" && c.templateFile() == "" {
		if c.XDSSocket == "" {
			bad("XDSSocket is empty")
		}
		if c.SDSSocket == "" {
			bad("SDSSocket is empty")
		}
	}
	return errors.Join(errs...)
}

// templateFile is the template to render, by Istio's precedence (ISTIO_BOOTSTRAP first; a custom
// config file disables --templateFile/proxyBootstrapTemplatePath); "" means the built-in bootstrap.
func (c Config) templateFile() string {
	if c.IstioBootstrap != "" {
		return c.IstioBootstrap
	}
	if c.customConfigFile() != "" {
		return ""
	}
	if c.TemplateFile != "" {
		return c.TemplateFile
	}
	return c.Proxy.GetProxyBootstrapTemplatePath()
}

// ReadinessInEnvoy says whether the agent tells Envoy its readiness (ReadinessKey): only into the
// bootstrap it writes itself, whose :15021 listener reads the key. A user template or a custom
// config file is the user's listener, forwarded to the agent as Istio's is.
func (c Config) ReadinessInEnvoy() bool {
	return c.EnvoyAnswersReadiness && c.templateFile() == "" && c.customConfigFile() == ""
}

// customConfigFile is the file passed to Envoy unchanged, unless ISTIO_BOOTSTRAP is set.
func (c Config) customConfigFile() string {
	if c.IstioBootstrap != "" {
		return ""
	}
	if c.CustomConfigFile != "" {
		return c.CustomConfigFile
	}
	return c.Proxy.GetCustomConfigFile()
}

// metadataDiscovery is the METADATA_DISCOVERY metadata: PEER_METADATA_DISCOVERY when set, else
// whether ISTIO_META_ENABLE_HBONE is true (Istio's GetNodeMetaData); meta has been through Istio's
// typed pass, which writes a true value "true".
func (c Config) metadataDiscovery(meta map[string]any) bool {
	if c.MetadataDiscovery != nil {
		return *c.MetadataDiscovery
	}
	return meta["ENABLE_HBONE"] == "true"
}

// metadataDiscoveryExtension says whether the bootstrap has Istio's metadata_discovery extension:
// always for a waypoint, else as the metadata says, and never over state-of-the-world xDS, which
// does not support it (Istio's pkg/bootstrap/config.go).
func (c Config) metadataDiscoveryExtension(node nodeInfo) bool {
	if c.ProxyType == "waypoint" {
		return true
	}
	return c.DeltaXDS && c.metadataDiscovery(node.raw)
}

// AgentListenerStats are the stat names of the agent's own listeners in this bootstrap (the
// ENVOY_STATUS_PORT and ENVOY_PROMETHEUS_PORT listeners, on either family, and admin): their
// connections do not count when a drain waits for active connections to end (Istio's
// knownIstioListeners).
func (c Config) AgentListenerStats() []string {
	var out []string
	for _, port := range []int{c.EnvoyStatusPort, c.EnvoyPrometheusPort} {
		for _, host := range []string{"0.0.0.0", "[__]", "127.0.0.1", "[__1]"} {
			out = append(out, fmt.Sprintf("%s_%d", host, port))
		}
	}
	return append(out, "admin", "admin.main_thread")
}

// pilotSAN is the PILOT_SAN metadata: explicit, or the discovery host under MUTUAL_TLS.
func (c Config) pilotSAN() []string {
	if c.PilotSAN != nil {
		return c.PilotSAN
	}
	if c.Proxy.GetControlPlaneAuthPolicy() != meshv1alpha1.AuthenticationPolicy_MUTUAL_TLS {
		return nil
	}
	host, _, _ := strings.Cut(c.Proxy.GetDiscoveryAddress(), ":")
	switch host {
	case "":
		return nil
	case "localhost":
		// Istio's GetPilotSan: a control plane reached on localhost (debugging) still presents
		// istiod's certificate.
		host = "istiod.istio-system.svc"
	}
	return []string{host}
}

// write is Write for a config already validated, also returning what it
// wrote (nil for a custom config file, which it does not write).
func write(c Config) (File, []byte, error) {
	var out File
	if c.OverrideFile != "" {
		js, err := readOverride(c.OverrideFile, c.HostIP)
		if err != nil {
			return File{}, nil, err
		}
		out.ConfigYAML = js
	}

	if custom := c.customConfigFile(); custom != "" {
		// Envoy reads it: a readable regular file (a FIFO here would
		// block the open for ever, issue #21).
		f, _, err := boundedfile.Open(custom)
		if err != nil {
			return File{}, nil, fmt.Errorf("custom config file (ProxyConfig.customConfigFile): %w", err)
		}
		f.Close()
		out.Path, out.Custom = custom, true
		return out, nil, nil
	}

	if err := writeLightstepToken(c); err != nil {
		return File{}, nil, err
	}
	var (
		data []byte
		name = outputJSON
		err  error
	)
	if tmpl := c.templateFile(); tmpl != "" {
		if strings.HasSuffix(tmpl, ".yaml") || strings.HasSuffix(tmpl, ".yaml.tmpl") {
			name = outputYAML
		}
		data, err = renderTemplateFile(tmpl, c)
	} else {
		data, err = renderDefault(c)
	}
	if err != nil {
		return File{}, nil, err
	}
	out.Path = filepath.Join(c.ConfigPath, name)
	if err := writeAtomic(out.Path, data); err != nil {
		return File{}, nil, err
	}
	return out, data, nil
}

// renderDefault builds the built-in bootstrap and marshals it to stable, indented JSON.
func renderDefault(c Config) ([]byte, error) {
	node, err := buildNode(c)
	if err != nil {
		return nil, err
	}
	b, err := defaultBootstrap(c, node)
	if err != nil {
		return nil, err
	}
	return marshalBootstrap(b)
}

// parseBootstrap checks that JSON or YAML text is a Bootstrap Envoy can load: known types, valid
// field values (unknown fields are allowed, as Envoy runs with --allow-unknown-static-fields), and
// Envoy's validation rules where the build carries them (checkEnvoyRules).
func parseBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	b := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(js, b); err != nil {
		return nil, err
	}
	if err := checkEnvoyRules(b); err != nil {
		return nil, err
	}
	return b, nil
}

// writeAtomic writes data next to path and renames it into place, so Envoy never reads half a file.
// Unlike services/internal/atomicfile it does not fsync: this write is on the path from an Envoy
// crash to the next Envoy, and the agent writes the file again at every start, so a file lost to
// a power cut costs nothing.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create config dir %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// readOverride reads ISTIO_BOOTSTRAP_OVERRIDE (YAML or JSON) and returns it as JSON, with $(HOST_IP)
// replaced by hostIP (bracketed when it is IPv6, without doubling brackets the user wrote).
func readOverride(path, hostIP string) (string, error) {
	b, err := boundedfile.Read(path, boundedfile.MaxConfig)
	if err != nil {
		return "", fmt.Errorf("bootstrap override (ISTIO_BOOTSTRAP_OVERRIDE): %w", err)
	}
	if strings.Contains(hostIP, ":") {
		hostIP = "[" + hostIP + "]"
		b = bytes.ReplaceAll(b, []byte("[$(HOST_IP)]"), []byte(hostIP))
	}
	b = bytes.ReplaceAll(b, []byte("$(HOST_IP)"), []byte(hostIP))
	js, err := yaml.YAMLToJSON(b)
	if err != nil {
		return "", fmt.Errorf("bootstrap override (ISTIO_BOOTSTRAP_OVERRIDE) %s: not YAML or JSON: %w", path, err)
	}
	return string(js), nil
}
