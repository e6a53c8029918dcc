package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/services/envoy/bootstrap"

	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/services/envoy"
)

// envoyInputs are what the envoy service's config is built from besides
// the environment.
type envoyInputs struct {
	host      Host // the credential socket's probe
	root      string
	proxyType string
	flags     *ProxyFlags
	logAsJSON bool
	version   string // the agent's: ISTIO_VERSION in the node metadata
	pod       podInfo
	proxy     *meshconfig.ProxyConfig
	dns       dnsSettings
	euid      int
	// runAs, when not nil, is the uid/gid Envoy runs as whatever else
	// (`meshagent vm`: Istio's istio-proxy user).
	runAs *envoy.Credential
	// sdsSocket is the socket Envoy's sds-grpc cluster connects to (ours,
	// or an external SDS server's: WORKLOAD_IDENTITY_SOCKET_FILE).
	sdsSocket string
	// filesSDSSocket is the agent's file-secrets socket when an external
	// SDS server holds the workload identity ("" otherwise): the
	// sds-files-grpc cluster and the file-credential metadata, as Istio.
	filesSDSSocket string
	// lookPath finds an executable (exec.LookPath); nil skips the check of
	// ProxyConfig's binaryPath (tests without an Envoy).
	lookPath func(string) (string, error)
}

// envoyConfig is the envoy service's config: Envoy's bootstrap and command
// line, its process and its drain, from the ProxyConfig, the pod and Istio's
// variables. The config is nil with DISABLE_ENVOY (proxyless gRPC); the
// bootstrap config is always returned: the XDS proxy and the gRPC bootstrap
// announce the same node.
func envoyConfig(r envReader, in envoyInputs) (*envoy.Config, *bootstrap.Config) {
	pc := in.proxy
	skipDeprecatedLogs := get(r, envEnvoySkipDeprecatedLogs)
	// Envoy inherits the environment, and its ISTIO_META_* become node metadata.
	env := r.env.source().All()
	b := &bootstrap.Config{
		ProxyType:       in.proxyType,
		PodName:         in.pod.name,
		PodNamespace:    in.pod.namespace,
		ServiceAccount:  in.pod.serviceAccount,
		InstanceIPs:     in.pod.nodeIPs,
		Domain:          in.pod.domain,
		IstioVersion:    in.version,
		Proxy:           pc,
		Env:             env,
		LabelsFile:      Rooted(in.root, podLabelsFile),
		AnnotationsFile: Rooted(in.root, podAnnotationsFile),
		ConfigPath:      Rooted(in.root, pc.ConfigPath),
		XDSSocket:       Rooted(in.root, filepath.Join(pc.ConfigPath, xdsSocketName)),
		SDSSocket:       in.sdsSocket,
		FilesSDSSocket:  in.filesSDSSocket,
		AdminPort:       int(pc.ProxyAdminPort),
		StatusPort:      int(pc.StatusPort),
		OutlierLogPath:  in.flags.outlierLogPath,
		LogAsJSON:       in.logAsJSON,

		EnvoyStatusPort:             get(r, envEnvoyStatusPort),
		EnvoyPrometheusPort:         get(r, envEnvoyPrometheusPort),
		IstioBootstrap:              get(r, envIstioBootstrap),
		OverrideFile:                get(r, envIstioBootstrapOverride),
		HostIP:                      get(r, envHostIP),
		DeltaXDS:                    get(r, envIstioDeltaXDS),
		DualStack:                   get(r, envIstioDualStack),
		ExitOnZeroActiveConnections: get(r, envExitOnZeroActiveConnections),
		MetadataDiscovery:           optional(r, envPeerMetadataDiscovery),
		// Istio's bootstrap reads this from ProxyConfig.proxyMetadata, not
		// from the environment (pkg/bootstrap/option MetricsLocalhostAccessOnly).
		MetricsLocalhostOnly:   pc.GetProxyMetadata()["METRICS_LOCALHOST_ACCESS_ONLY"] == "true",
		CredentialSocketExists: in.host.socketLive(Rooted(in.root, credentialSocket)),
		// Istio's agent copies DNS_PROXY_ADDR into the node metadata as set,
		// whether or not its DNS proxy runs.
		DNSProxyAddr:               in.dns.given,
		SkipDeprecatedLogs:         skipDeprecatedLogs,
		WorkloadIdentitySocketFile: get(r, envWorkloadIdentitySocketFile),
		SecureMetricsPort:          get(r, envEnvoySecureMetricsPort),
		SecureMergedMetricsPort:    get(r, envEnvoySecureMergedMetricsPort),
		StatusPortProxyProtocol:    get(r, envEnvoyStatusPortEnableProxyProtocol),
		EnvoyAnswersReadiness:      get(r, envMeshagentEnvoyAnswersReadiness),
		CompliancePolicy:           string(get(r, envCompliancePolicy)),
		KeepPathFragment:           !get(r, envHTTPStripFragmentFromPathUnsafeIfDisabled),
		Platform:                   platform(r),
	}
	if in.flags.serviceCluster != nil {
		b.ServiceCluster = *in.flags.serviceCluster
	}
	// As Istio's agent: --templateFile becomes ProxyConfig's template path
	// (and so shows in the PROXY_CONFIG metadata), unless a custom config
	// file replaces the bootstrap altogether.
	if in.flags.templateFile != "" && pc.CustomConfigFile == "" {
		pc.ProxyBootstrapTemplatePath = in.flags.templateFile
	}
	args := envoy.ArgsConfig{
		DrainDuration:      pc.GetDrainDuration().AsDuration(),
		FileFlushInterval:  time.Second, // Istio's when ProxyConfig.fileFlushInterval is unset
		FileFlushMinSizeKB: int(pc.GetFileFlushMinSizeKb()),
		LogLevel:           in.flags.proxyLogLevel,
		ComponentLogLevel:  in.flags.proxyComponentLogLevel,
		Concurrency:        int(pc.GetConcurrency().GetValue()),
		IPv6:               bootstrap.AllIPv6(in.pod.nodeIPs),
		SkipDeprecatedLogs: skipDeprecatedLogs,
		EnableCoreDump:     get(r, envIstioEnvoyEnableCoreDump),
	}
	if d := pc.GetFileFlushInterval(); d != nil {
		args.FileFlushInterval = d.AsDuration()
	}
	// MINIMUM_DRAIN_DURATION=0 means no minimum: only an unset variable
	// takes Istio's default.
	minimumDrain := get(r, envMinimumDrainDuration)
	if get(r, envDisableEnvoy) {
		return nil, b
	}
	// What Envoy is started from is checked now: a missing file was found
	// only after six failed starts, in a message naming Envoy (#21).
	if in.lookPath != nil {
		checkEnvoyBinary(r.problems, pc.BinaryPath, in.lookPath)
	}
	if b.IstioBootstrap != "" {
		checkRegularFile(r.problems, "ISTIO_BOOTSTRAP", b.IstioBootstrap)
	}

	adminHost := "127.0.0.1"
	if args.IPv6 {
		adminHost = "::1"
	}
	cfg := &envoy.Config{
		BinaryPath:                  pc.BinaryPath,
		Bootstrap:                   b,
		Args:                        args,
		AdminAddr:                   net.JoinHostPort(adminHost, strconv.Itoa(int(pc.ProxyAdminPort))),
		DrainQuery:                  drainQuery(in.proxyType),
		TerminationDrainDuration:    pc.GetTerminationDrainDuration().AsDuration(),
		MinimumDrainDuration:        minimumDrain,
		ExitOnZeroActiveConnections: b.ExitOnZeroActiveConnections,
		ExcludedListeners:           b.AgentListenerStats(),
		KillGrace:                   envoy.DefaultKillGrace,
		ReadyPollInterval:           envoy.DefaultReadyPollInterval,
		// Envoy inherits the environment, with what COMPLIANCE_POLICY adds
		// to it as Istio's agent does (#35).
		Env: append(slices.Clip(env), get(r, envCompliancePolicy).EnvoyEnv()...),
		// Crash records (issue 22) beside the bootstrap, in the directory
		// Istio's injector mounts writable (istio-envoy, an emptyDir).
		CrashDir: Rooted(in.root, filepath.Join(pc.ConfigPath, envoyCrashDir)),
	}
	// Istio runs Envoy as 1337 only when the agent is root and the DNS
	// proxy takes port 53 (otherwise the container already runs as 1337).
	switch {
	case in.runAs != nil:
		cfg.RunAs = in.runAs
	case in.euid == 0 && in.dns.enabled() && strings.HasSuffix(in.dns.addr, ":53"):
		cfg.RunAs = &envoy.Credential{UID: proxyUID, GID: proxyUID}
	}
	return cfg, b
}

// envoyCrashDir is where Envoy's crash records are kept, under configPath.
const envoyCrashDir = "envoy-crashes"

// checkEnvoyBinary reports a binaryPath that names no executable file.
func checkEnvoyBinary(p *Problems, path string, lookPath func(string) (string, error)) {
	_, err := lookPath(path)
	var why string
	switch {
	case err == nil:
		return
	case errors.Is(err, fs.ErrNotExist):
		why = "does not exist"
	case errors.Is(err, exec.ErrNotFound):
		why = "not found on PATH"
	case errors.Is(err, fs.ErrPermission):
		why = "is not executable"
	default:
		why = err.Error()
	}
	p.addf("ProxyConfig binaryPath %s (Envoy): %s; install Envoy there, set binaryPath (PROXY_CONFIG or the mesh config's defaultConfig), or DISABLE_ENVOY=true for no Envoy",
		quoteValue(path), why)
}

// checkRegularFile reports a variable that does not name a readable
// regular file, through the one check cmd makes of a file someone else
// named (openConfigFile: stat first, so a FIFO cannot block the start).
func checkRegularFile(p *Problems, name, path string) {
	f, err := openConfigFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		p.addf("%s=%s: no such file", name, quoteValue(path))
	case err != nil:
		p.addf("%s=%s: %v", name, quoteValue(path), err)
	default:
		f.Close()
	}
}

// drainQuery is Istio's drain_listeners query for the proxy type: only a
// sidecar drains its inbound listeners alone; gateways and waypoints drain
// them all (pkg/envoy/proxy.go: inboundonly iff the proxy is a sidecar).
func drainQuery(proxyType string) string {
	if proxyType == "sidecar" {
		return sidecarDrainQuery
	}
	return gatewayDrainQuery
}

// platform is the cloud platform's metadata as Istio's agent finds it
// without asking a metadata server (pkg/bootstrap/platform): on GCP
// (CLOUD_PLATFORM=gcp, or unset with GCP_METADATA), GCP_METADATA
// (PROJECT_ID|PROJECT_NUMBER|CLUSTER_NAME|CLUSTER_LOCATION), GCP_QUOTA_PROJECT
// and GCP_ZONE. meshagent asks no metadata server: with CLOUD_PLATFORM unset
// Istio's agent probes GCP's, AWS's and Azure's for up to 5 s.
func platform(r envReader) bootstrap.Platform {
	cloud := strings.ToLower(get(r, envCloudPlatform))
	gcpMeta := get(r, envGCPMetadata)
	if cloud != "gcp" && (cloud != "" || gcpMeta == "") || gcpMeta == "" {
		return bootstrap.Platform{}
	}
	md := map[string]string{}
	if parts := strings.Split(gcpMeta, "|"); len(parts) == 4 {
		md["gcp_project"], md["gcp_project_number"], md["gcp_gke_cluster_name"], md["gcp_location"] = parts[0], parts[1], parts[2], parts[3]
		md["gcp_gke_cluster_url"] = fmt.Sprintf("https://container.googleapis.com/v1/projects/%s/locations/%s/clusters/%s", parts[0], parts[3], parts[2])
	}
	if q := get(r, envGCPQuotaProject); q != "" {
		md["gcp_quota_project"] = q
	}
	zone := get(r, envGCPZone)
	if zone != "" {
		md["gcp_zone"] = zone
	}
	return bootstrap.Platform{Metadata: md, Zone: zone}
}
