package config

// Istio's names, defaults and paths that no variable sets: every port,
// every path under --root, the Envoy binary and the drain durations the
// agent uses come from here, and the services receive them as explicit
// values. The defaults of what a variable sets are in the table (env.go). Values are
// those of Istio's pilot-agent (pkg/config/constants, pkg/security,
// pilot/cmd/pilot-agent/options, pkg/config/mesh DefaultProxyConfig).

import (
	"path/filepath"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	meshconfig "istio.io/api/mesh/v1alpha1"
)

// Ports.
const (
	istioIptablesEnvoyPort = "15001" // istio-iptables' --envoy-port: outbound TCP is redirected there
	adminPort              = 15000   // ProxyConfig.proxyAdminPort: Envoy admin, loopback only
	agentStatusPort        = 15020   // ProxyConfig.statusPort: the agent's status server
)

// Paths, relative to --root ("/" in production), in Istio's spelling.
const (
	ConfigPathDir         = "./etc/istio/proxy"       // ProxyConfig.configPath: bootstrap, XDS socket
	xdsSocketName         = "XDS"                     // <configPath>/XDS: the xDS unix socket
	MeshConfigFile        = "./etc/istio/config/mesh" // --meshConfig
	podLabelsFile         = "./etc/istio/pod/labels"  // Downward API
	podAnnotationsFile    = "./etc/istio/pod/annotations"
	workloadIdentityDir   = "./var/run/secrets/workload-spiffe-uds"         // SDS socket directory
	credentialSocket      = "./var/run/secrets/credential-uds/socket"       // an external credential SDS server
	credentialFilesSocket = "./var/run/secrets/credential-uds/files-socket" // ours, files only, beside an external SDS server
	xdsCacheFile          = "xds-cache.pb"                                  // <configPath>/xds-cache.pb: the last-known-good xDS configuration
	wasmModuleDir         = "./var/lib/istio/data"                          // fetched Wasm modules (Istio's constants.IstioDataDir)
	RootLockFile          = "meshagent.lock"                                // <configPath>/meshagent.lock: one agent per root (cmd's rootlock.go)
	etcCertsDir           = "./etc/certs"                                   // file-mounted certificates, OUTPUT_CERTS on VMs
	workloadCredsDir      = "./var/run/secrets/workload-spiffe-credentials" // file-mounted certificates (SPIFFE layout)
	caRootCertFile        = "./var/run/secrets/istio/root-cert.pem"         // the control plane CA's root (configmap istio-ca-root-cert)
	caCRLFile             = "./var/run/secrets/istio/crl/ca-crl.pem"        // the plugged-in CA's CRL
	TokenFile             = "./var/run/secrets/tokens/istio-token"          // JWT for the CA and xDS
	VMCertsDir            = "/etc/certs"                                    // a VM's PROV_CERT and OUTPUT_CERTS (istio-start.sh), under --root
	envoyBinaryPath       = "/usr/local/bin/envoy"                          // ProxyConfig.binaryPath: not under --root
	ResolvConfFile        = "/etc/resolv.conf"                              // --resolv-conf: not under --root
)

// Drain and stop durations: Istio's, then meshagent's own.
const (
	istioDrainDuration            = 45 * time.Second // ProxyConfig.drainDuration ⇒ --drain-time-s
	istioTerminationDrainDuration = 5 * time.Second  // ProxyConfig.terminationDrainDuration

	// Not Istio's: how long the tree waits for services to stop, and for
	// a drain beyond terminationDrainDuration (Envoy's SIGTERM, then
	// SIGKILL after envoy's KillGrace).
	serviceStopTimeout = 10 * time.Second
	drainStopMargin    = 15 * time.Second
	envoyStopMargin    = 10 * time.Second
)

// Envoy's drain_listeners queries (Istio's pkg/envoy/admin.go): a sidecar
// drains its inbound listeners only, a gateway every listener.
const (
	sidecarDrainQuery = "inboundonly&graceful"
	gatewayDrainQuery = "graceful"
)

// Identity.
const (
	proxyUID = 1337 // Envoy's uid/gid when the agent must switch (DNS on :53 as root); --proxy-uid's last resort
	// unsetIdentityName is the namespace and service account a CSR names
	// when POD_NAMESPACE or SERVICE_ACCOUNT is unset (a VM without them).
	unsetIdentityName = "default"
)

// defaultProxyConfig is Istio's DefaultProxyConfig (pkg/config/mesh). It
// has no concurrency: Istio dropped its default of 2, so Envoy's worker
// count comes from ISTIO_CPU_LIMIT or Envoy's own (one per CPU).
func defaultProxyConfig() *meshconfig.ProxyConfig {
	return &meshconfig.ProxyConfig{
		ConfigPath:               ConfigPathDir,
		ClusterName:              &meshconfig.ProxyConfig_ServiceCluster{ServiceCluster: "istio-proxy"},
		DrainDuration:            durationpb.New(istioDrainDuration),
		TerminationDrainDuration: durationpb.New(istioTerminationDrainDuration),
		ProxyAdminPort:           adminPort,
		ControlPlaneAuthPolicy:   meshconfig.AuthenticationPolicy_MUTUAL_TLS,
		DiscoveryAddress:         "istiod.istio-system.svc:15012",
		BinaryPath:               envoyBinaryPath,
		StatNameLength:           189,
		StatusPort:               agentStatusPort,
	}
}

// Rooted places an Istio path under the agent's root.
func Rooted(root, path string) string { return filepath.Join(root, path) }
