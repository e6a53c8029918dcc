// Package config is the agent's configuration apart from its commands
// (#26): the translation of Istio's flags, environment variables,
// ProxyConfig layers, mesh config file, pod files and a VM's cluster.env
// into the plan of what the agent runs (Build, BuildStandalone, ReadVM);
// the one table of every environment variable the agent reads, each
// entry with its default value and its parser (this file), and the
// flags bound to it (flagenv.go).
//
// It reads the host only through Host, which the commands fill (the
// process environment, interfaces, users, executables, the root's lock),
// and it runs nothing: cmd/meshagent builds the tree from its result.
package config

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"
)

// Services a variable feeds, besides the services' own names: the pod's
// identity (node id, SPIFFE ID, metadata: several services), the commands
// and the process itself.
const (
	svcPod        = "pod"
	svcEnvoy      = "envoy"
	svcCerts      = "certs"
	svcSDS        = "sds"
	svcXDS        = "xdsproxy"
	svcDNS        = "dnsproxy"
	svcStatus     = "status"
	svcCapture    = "capture"
	svcVM         = "vm"
	svcStandalone = "standalone"
	svcProcess    = "process"
)

// The table: every environment variable the agent reads, and its
// default, here and nowhere else (#34). `meshagent help env` prints it.
//
// How to add a variable: one line in its service's group,
//
//	envMyThing = setting(asDuration, "MY_THING", 5*time.Second, svcXDS, "what it means")
//
// (the kind: asBool, asDuration, asPort, asCount, asNumber, asText("type
// as help names it"), ... in parse.go; .derived("...") when the default
// is computed from something else, and help should say so), then read it
// in the builder of its service with get(r, envMyThing) (lookup when unset
// differs from the default), and name it in docs/reference.md. A variable
// that stands in for a flag is bound with envFlagVar instead. The service
// holds no default of its own: the Config field that takes the value as
// it is gets the tag env:"MY_THING", from which its tests take the
// table's default (testkit.FillFromTable; TestTaggedFieldsTakeTheirVariable).
var (
	// The pod: who the workload is (Istio's injector sets these).
	envPodName        = setting(asPodName, "POD_NAME", "", svcPod, "the pod's name: node id, metadata")
	envPodNamespace   = setting(asDNSLabel, "POD_NAMESPACE", "", svcPod, "the pod's namespace: node id, DNS domain, SPIFFE ID")
	envServiceAccount = setting(asDNSSubdomain, "SERVICE_ACCOUNT", "", svcPod, "the pod's service account: SPIFFE ID")
	envInstanceIP     = setting(asText("IP list"), "INSTANCE_IP", "", svcPod, "the pod's IPs, comma separated, before the host's: node id, probes' destination")
	envProxyConfig    = setting(asText("YAML or JSON"), "PROXY_CONFIG", "", svcPod, "a ProxyConfig layer over the mesh config file's defaultConfig")
	envIstioCPULimit  = setting(asCount, "ISTIO_CPU_LIMIT", 0, svcEnvoy, "Envoy's --concurrency when ProxyConfig sets none")

	// Envoy: its bootstrap, command line and process.
	envIstioMeta                                 = prefix("ISTIO_META_", "string", svcEnvoy, "Envoy node metadata, one key per variable")
	envIstioMetajson                             = prefix("ISTIO_METAJSON_", "JSON object", svcEnvoy, "Envoy node metadata merged from a JSON object (_LABELS: the static labels)")
	envEnvoyStatusPort                           = setting(asPort, "ENVOY_STATUS_PORT", 15021, svcEnvoy, "Envoy's readiness listener, forwarding to the agent")
	envEnvoyPrometheusPort                       = setting(asPort, "ENVOY_PROMETHEUS_PORT", 15090, svcEnvoy, "Envoy's Prometheus listener, merged into :15020/stats/prometheus")
	envEnvoySecureMetricsPort                    = setting(asPortOrOff, "ENVOY_SECURE_METRICS_PORT", 0, svcEnvoy, "Envoy's mTLS metrics listener")
	envEnvoySecureMergedMetricsPort              = setting(asPortOrOff, "ENVOY_SECURE_MERGED_METRICS_PORT", 0, svcEnvoy, "Envoy's mTLS listener for the merged metrics")
	envEnvoyStatusPortEnableProxyProtocol        = setting(asBool, "ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL", false, svcEnvoy, "the readiness listener accepts the PROXY protocol")
	envIstioBootstrap                            = setting(asText("path"), "ISTIO_BOOTSTRAP", "", svcEnvoy, "the bootstrap template, instead of the built-in one")
	envIstioBootstrapOverride                    = setting(asText("path"), "ISTIO_BOOTSTRAP_OVERRIDE", "", svcEnvoy, "a file given to Envoy as --config-yaml, over the bootstrap")
	envHostIP                                    = setting(asText("string"), "HOST_IP", "", svcEnvoy, "the node's IP, in the bootstrap (tracing, stats sinks)")
	envIstioDeltaXDS                             = setting(asBool, "ISTIO_DELTA_XDS", true, svcEnvoy, "Envoy's ADS is delta (incremental) xDS")
	envIstioDualStack                            = setting(asBool, "ISTIO_DUAL_STACK", false, svcEnvoy, "listeners for both IP families; istio-iptables' --dual-stack")
	envExitOnZeroActiveConnections               = setting(asBool, "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", false, svcEnvoy, "drain until Envoy's active connections reach zero")
	envMinimumDrainDuration                      = setting(asDuration, "MINIMUM_DRAIN_DURATION", 5*time.Second, svcEnvoy, "the shortest drain with EXIT_ON_ZERO_ACTIVE_CONNECTIONS (0: none)")
	envPeerMetadataDiscovery                     = setting(asBool, "PEER_METADATA_DISCOVERY", false, svcEnvoy, "the metadata_discovery extension and METADATA_DISCOVERY metadata").derived("ISTIO_META_ENABLE_HBONE")
	envEnvoySkipDeprecatedLogs                   = setting(asBool, "ENVOY_SKIP_DEPRECATED_LOGS", true, svcEnvoy, "Envoy's --skip-deprecated-logs")
	envIstioEnvoyEnableCoreDump                  = setting(asBool, "ISTIO_ENVOY_ENABLE_CORE_DUMP", false, svcEnvoy, "Envoy's --enable-core-dump")
	envDisableEnvoy                              = setting(asBool, "DISABLE_ENVOY", false, svcEnvoy, "no Envoy (proxyless gRPC): the agent serves xDS and certificates only")
	envCompliancePolicy                          = setting(asCompliancePolicy, "COMPLIANCE_POLICY", "", svcEnvoy+", "+svcCerts+", "+svcXDS, "TLS compliance policy: Envoy's bootstrap (fips-140-2), the agent's TLS to the CA and the control plane (versions, suites, curves; pqc: X25519MLKEM768 only)")
	envHTTPStripFragmentFromPathUnsafeIfDisabled = setting(asBool, "HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED", true, svcEnvoy, "false keeps a URL's #fragment in the path")
	envCloudPlatform                             = setting(asText("string"), "CLOUD_PLATFORM", "", svcEnvoy, "the platform whose metadata goes in the node (gcp; none)")
	envGCPMetadata                               = setting(asText("string"), "GCP_METADATA", "", svcEnvoy, "GCP's project|number|cluster|location, instead of the metadata server")
	envGCPQuotaProject                           = setting(asText("string"), "GCP_QUOTA_PROJECT", "", svcEnvoy, "GCP's quota project, in the node metadata")
	envGCPZone                                   = setting(asText("string"), "GCP_ZONE", "", svcEnvoy, "GCP's zone, in the node's locality")

	// Certificates and SDS.
	envPilotCertProvider            = setting(asText("string"), "PILOT_CERT_PROVIDER", "istiod", svcCerts, "where the certificates come from (istiod, kubernetes, k8s.io/<signer>, custom, none)")
	envCAAddr                       = setting(asHostPort, "CA_ADDR", "", svcCerts, "the CA's address").derived("discoveryAddress")
	envCARootCA                     = setting(asText("path or SYSTEM"), "CA_ROOT_CA", "", svcCerts, "the roots verifying the CA").derived(caRootCertFile + ", or PROV_CERT's root")
	envCAHeader                     = prefix("CA_HEADER_", "string", svcCerts, "gRPC headers on CSRs, one per variable")
	envIstiodSAN                    = setting(asText("string"), "ISTIOD_SAN", "", svcCerts+", "+svcXDS, "the name verified on istiod's certificate")
	envProvCert                     = setting(asText("path"), "PROV_CERT", "", svcCerts+", "+svcXDS, "directory of a provisioning certificate (a VM's): its root verifies the CA and istiod, its cert-chain.pem and key.pem are the client certificate to both")
	envOutputCerts                  = setting(asText("path"), "OUTPUT_CERTS", "", svcCerts+", "+svcXDS, "directory the workload certificate is written to (and proxyless gRPC reads)")
	envFileMountedCerts             = setting(asBool, "FILE_MOUNTED_CERTS", false, svcCerts, "certificates come from files only, never the CA")
	envFileDebounceDuration         = setting(asDuration, "FILE_DEBOUNCE_DURATION", 100*time.Millisecond, svcCerts+", "+svcSDS, "quiet time before changed certificate files are reloaded")
	envIstioMetaClusterID           = setting(asText("string"), "ISTIO_META_CLUSTER_ID", "", svcCerts+", "+svcXDS, "the cluster, in CSRs and xDS requests (and node metadata)")
	envIstioMetaCertSigner          = setting(asText("string"), "ISTIO_META_CERT_SIGNER", "", svcCerts, "the signer asked for in CSRs")
	envTrustDomain                  = setting(asTrustDomain, "TRUST_DOMAIN", "cluster.local", svcCerts, "the SPIFFE trust domain")
	envSecretTTL                    = setting(asDuration, "SECRET_TTL", 24*time.Hour, svcCerts, "the workload certificate's requested lifetime")
	envSecretGracePeriodRatio       = setting(asNumber, "SECRET_GRACE_PERIOD_RATIO", 0.5, svcCerts, "renew when this share of the lifetime is left")
	envSecretGracePeriodRatioJitter = setting(asNumber, "SECRET_GRACE_PERIOD_RATIO_JITTER", 0.01, svcCerts, "random spread of the renewal time")
	envWorkloadRSAKeySize           = setting(asCount, "WORKLOAD_RSA_KEY_SIZE", 2048, svcCerts, "RSA key size")
	envECCSignatureAlgorithm        = setting(asKeyAlgorithm, "ECC_SIGNATURE_ALGORITHM", "RSA", svcCerts, "the workload key's algorithm")
	envECCCurve                     = setting(asECCCurve, "ECC_CURVE", "P256", svcCerts, "the ECDSA curve")
	envPKCS8Key                     = setting(asBool, "PKCS8_KEY", false, svcCerts, "the key is written as PKCS#8")
	envKubernetesServiceHost        = setting(asText("string"), "KUBERNETES_SERVICE_HOST", "", svcCerts, "set on Kubernetes: OUTPUT_CERTS files are 0644")
	envWorkloadIdentitySocketFile   = setting(asText("file name"), "WORKLOAD_IDENTITY_SOCKET_FILE", "socket", svcSDS+", "+svcEnvoy, "the SDS socket's name in ./var/run/secrets/workload-spiffe-uds")
	envPilotEnableCACRL             = setting(asBool, "PILOT_ENABLE_CA_CRL", true, svcSDS, "serve the CA's CRL (./var/run/secrets/istio/crl) with the roots")

	// The XDS proxy.
	envXDSRootCA                = setting(asText("path or SYSTEM"), "XDS_ROOT_CA", "", svcXDS, "the roots verifying istiod (else ./etc/certs, PROV_CERT, the CA root)")
	envXDSHeader                = prefix("XDS_HEADER_", "string", svcXDS, "gRPC headers on the upstream xDS stream, one per variable")
	envGRPCKeepaliveInterval    = setting(asDuration, "GRPC_KEEPALIVE_INTERVAL", 30*time.Second, svcXDS, "keepalive pings on the upstream stream (0: gRPC's own, as in Istio: every 10s)")
	envGRPCKeepaliveTimeout     = setting(asDuration, "GRPC_KEEPALIVE_TIMEOUT", 10*time.Second, svcXDS, "keepalive ping timeout (0: gRPC's own, 20s, as in Istio)")
	envProxyConfigXDSAgent      = setting(asBool, "PROXY_CONFIG_XDS_AGENT", false, svcXDS, "ask istiod for ProxyConfig (its caCertificatesPem)")
	envXDSOfflineCache          = setting(asBool, "XDS_OFFLINE_CACHE", true, svcXDS, "ours: keep Envoy's last ACKed config and serve it while istiod is away")
	envGRPCXDSBootstrap         = setting(asText("path"), "GRPC_XDS_BOOTSTRAP", "./etc/istio/proxy/grpc-bootstrap.json", svcXDS, "where proxyless gRPC's bootstrap is written")
	envWasmRemoteLoadConversion = setting(asBool, "ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION", true, svcXDS, "fetch the remote Wasm modules of ECDS resources into ./var/lib/istio/data and give Envoy the local file")
	envWasmInsecureRegistries   = setting(asText("host list or *"), "WASM_INSECURE_REGISTRIES", "", svcXDS, "registries and HTTPS servers of Wasm modules fetched without verifying their certificate (or over plain HTTP)")
	envWasmModuleExpiry         = setting(asDuration, "WASM_MODULE_EXPIRY", 24*time.Hour, svcXDS, "a cached Wasm module unused for this long is removed (0: the default, as in Istio)")
	envWasmPurgeInterval        = setting(asDuration, "WASM_PURGE_INTERVAL", time.Hour, svcXDS, "how often expired Wasm modules are removed (0: the default, as in Istio)")
	envWasmHTTPRequestTimeout   = setting(asPositive, "WASM_HTTP_REQUEST_TIMEOUT", 15*time.Second, svcXDS, "timeout of each HTTP(S) request for a Wasm module")
	envWasmHTTPRequestRetries   = setting(asPositiveCount, "WASM_HTTP_REQUEST_MAX_RETRIES", 5, svcXDS, "attempts of an HTTP(S) Wasm module fetch")
	envWasmMaxBinarySize        = setting(asPositiveCount, "ISTIO_WASM_MAX_BINARY_SIZE_BYTES", 256<<20, svcXDS, "the largest Wasm module fetched (256 MiB)")

	// The DNS proxy.
	envIstioMetaDNSCapture      = setting(asBool, "ISTIO_META_DNS_CAPTURE", false, svcDNS+", "+svcCapture, "the DNS proxy on, and DNS redirected to it (sidecars)")
	envIstioMetaEnableDNSServer = setting(asBool, "ISTIO_META_ENABLE_DNS_SERVER", false, svcDNS, "the DNS proxy on, without capture")
	envDNSProxyAddr             = setting(asHostPort, "DNS_PROXY_ADDR", "localhost:15053", svcDNS+", "+svcEnvoy, "the DNS proxy's address (loopback only); in the node metadata as set")
	envDNSForwardTimeout        = setting(asDuration, "DNS_FORWARD_TIMEOUT", 5*time.Second, svcDNS, "timeout of a query forwarded upstream (Istio's dnsClient.DefaultUpstreamTimeout)")
	envDNSForwardParallel       = setting(asBool, "DNS_FORWARD_PARALLEL", false, svcDNS, "forward to every upstream at once, first answer wins")

	// The status server.
	envIstioKubeAppProbers                    = setting(asText("JSON"), "ISTIO_KUBE_APP_PROBERS", "", svcStatus, "the application's probes, answered on /app-health/...")
	envRewriteProbeLegacyLocalhostDestination = setting(asBool, "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", false, svcStatus, "probes go to localhost, not INSTANCE_IP")
	envIstioEnableHTTP2Probing                = setting(asBool, "ISTIO_ENABLE_HTTP2_PROBING", true, svcStatus, "HTTP/2 for HTTPS probes")
	envEnableProbeKeepaliveConnections        = setting(asBool, "ENABLE_PROBE_KEEPALIVE_CONNECTIONS", false, svcStatus, "probe connections kept between probes")
	envIstioPrometheusAnnotations             = setting(asText("JSON"), "ISTIO_PROMETHEUS_ANNOTATIONS", "", svcStatus, "the application's metrics merged into /stats/prometheus")
	envPilotAgentMergeEnvoyStats              = setting(asBool, "PILOT_AGENT_MERGE_ENVOY_STATS", true, svcStatus, "Envoy's metrics merged into /stats/prometheus")
	envMetricsLocalhostAccessOnly             = setting(asBool, "METRICS_LOCALHOST_ACCESS_ONLY", false, svcStatus, "/stats/prometheus and /metrics answer loopback callers only")

	// istio-iptables' flags (pkg/flag.BindEnv: UPPER_SNAKE of the flag)
	// and its variables: `istio-iptables`, `clean-iptables`, proxy --capture.
	envInboundCapturePort              = setting(asText("port"), "INBOUND_CAPTURE_PORT", "15006", svcCapture, "--inbound-capture-port: where inbound TCP is redirected")
	envInboundTunnelPort               = setting(asText("port"), "INBOUND_TUNNEL_PORT", "15008", svcCapture, "--inbound-tunnel-port: Envoy's HBONE port, never captured")
	envProxyUID                        = setting(asText("uid list"), "PROXY_UID", "", svcCapture, "--proxy-uid: the proxy's uids, whose traffic is not captured").derived("uid of ENVOY_USER, else 1337")
	envProxyGID                        = setting(asText("gid list"), "PROXY_GID", "", svcCapture, "--proxy-gid: the proxy's gids").derived("PROXY_UID")
	envEnvoyUser                       = setting(asText("user"), "ENVOY_USER", "istio-proxy", svcCapture, "the user whose uid is --proxy-uid's default")
	envIstioInboundInterceptionMode    = setting(asText("REDIRECT or TPROXY"), "ISTIO_INBOUND_INTERCEPTION_MODE", "", svcCapture, "--istio-inbound-interception-mode").derived("REDIRECT")
	envIstioInboundTProxyMark          = setting(asText("string"), "ISTIO_INBOUND_TPROXY_MARK", "1337", svcCapture, "--istio-inbound-tproxy-mark: TPROXY's packet mark")
	envIstioInboundTProxyRouteTable    = setting(asText("string"), "ISTIO_INBOUND_TPROXY_ROUTE_TABLE", "133", svcCapture, "--istio-inbound-tproxy-route-table: TPROXY's routing table")
	envIstioInboundPorts               = setting(asText("port list or *"), "ISTIO_INBOUND_PORTS", "", svcCapture, "--istio-inbound-ports: inbound ports captured")
	envIstioLocalExcludePorts          = setting(asText("port list"), "ISTIO_LOCAL_EXCLUDE_PORTS", "", svcCapture, "--istio-local-exclude-ports: inbound ports not captured")
	envIstioExcludeInterfaces          = setting(asText("list"), "ISTIO_EXCLUDE_INTERFACES", "", svcCapture, "--istio-exclude-interfaces: interfaces never captured")
	envIstioServiceCIDR                = setting(asText("CIDR list or *"), "ISTIO_SERVICE_CIDR", "", svcCapture, "--istio-service-cidr: outbound ranges captured")
	envIstioServiceExcludeCIDR         = setting(asText("CIDR list"), "ISTIO_SERVICE_EXCLUDE_CIDR", "", svcCapture, "--istio-service-exclude-cidr: outbound ranges never captured")
	envIstioOutboundPorts              = setting(asText("port list"), "ISTIO_OUTBOUND_PORTS", "", svcCapture, "--istio-outbound-ports: outbound ports always captured")
	envIstioLocalOutboundPortsExclude  = setting(asText("port list"), "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE", "", svcCapture, "--istio-local-outbound-ports-exclude: outbound ports never captured")
	envKubeVirtInterfaces              = setting(asText("list"), "KUBE_VIRT_INTERFACES", "", svcCapture, "--kube-virt-interfaces: inbound on them treated as outbound")
	envDryRun                          = setting(asBool, "DRY_RUN", false, svcCapture, "--dry-run: print the rules, change nothing")
	envIptablesProbePort               = setting(asPort, "IPTABLES_PROBE_PORT", 15002, svcCapture, "--iptables-probe-port: the validation probe's port")
	envProbeTimeout                    = setting(asDuration, "PROBE_TIMEOUT", 5*time.Second, svcCapture, "--probe-timeout: the validation probe's timeout")
	envSkipRuleApply                   = setting(asBool, "SKIP_RULE_APPLY", false, svcCapture, "--skip-rule-apply: validate only")
	envRunValidation                   = setting(asBool, "RUN_VALIDATION", false, svcCapture, "--run-validation: check capture with a probe connection")
	envRedirectDNS                     = setting(asBool, "REDIRECT_DNS", false, svcCapture, "--redirect-dns: DNS redirected to the DNS proxy").derived("ISTIO_META_DNS_CAPTURE")
	envDropInvalid                     = setting(asBool, "DROP_INVALID", false, svcCapture, "--drop-invalid: drop packets conntrack marks INVALID").derived("INVALID_DROP")
	envInvalidDrop                     = setting(asBool, "INVALID_DROP", false, svcCapture, "--drop-invalid's older name")
	envDualStack                       = setting(asBool, "DUAL_STACK", false, svcCapture, "--dual-stack: rules for IPv6 too").derived("ISTIO_DUAL_STACK")
	envCaptureAllDNS                   = setting(asBool, "CAPTURE_ALL_DNS", false, svcCapture, "--capture-all-dns: DNS to any server, not only resolv.conf's")
	envNetworkNamespace                = setting(asText("path"), "NETWORK_NAMESPACE", "", svcCapture, "--network-namespace: the namespace programmed from outside it")
	envCNIMode                         = setting(asBool, "CNI_MODE", false, svcCapture, "--cni-mode: running inside the CNI plugin")
	envReconcile                       = setting(asBool, "RECONCILE", false, svcCapture, "--reconcile: replace drifted rules")
	envCleanupOnly                     = setting(asBool, "CLEANUP_ONLY", false, svcCapture, "--cleanup-only: only remove the rules")
	envForceApply                      = setting(asBool, "FORCE_APPLY", false, svcCapture, "--force-apply: apply even if the rules are in place")
	envNativeNftables                  = setting(asBool, "NATIVE_NFTABLES", false, svcCapture, "--native-nftables: nftables instead of iptables rules")
	envForceIptablesBinary             = setting(asText("legacy or nft"), "FORCE_IPTABLES_BINARY", "", svcCapture, "--force-iptables-binary: the iptables flavour")
	envIstioOutboundOwnerGroups        = setting(asText("group list"), "ISTIO_OUTBOUND_OWNER_GROUPS", "*", svcCapture, "groups whose outbound traffic is captured")
	envIstioOutboundOwnerGroupsExclude = setting(asText("group list"), "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "", svcCapture, "groups whose outbound traffic is not captured")
	envIstioOutboundIPv4LoopbackCIDR   = setting(asText("CIDR"), "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/32", svcCapture, "the loopback range outbound rules treat as local")

	// The commands' own settings (flags first, then these).
	envMeshagentRoot                  = setting(asText("path"), "MESHAGENT_ROOT", "/", svcProcess, "ours: --root, the directory every agent path lives under")
	envMeshagentCapture               = setting(asBool, "MESHAGENT_CAPTURE", false, svcCapture, "ours: proxy --capture, the agent applies and keeps the capture rules (VM)")
	envMeshagentCaptureCheckInterval  = setting(asPositive, "MESHAGENT_CAPTURE_CHECK_INTERVAL", 30*time.Second, svcCapture, "ours: proxy --capture-check-interval")
	envMeshagentHotRestart            = setting(asBool, "MESHAGENT_HOT_RESTART", false, svcEnvoy, "ours: proxy --hot-restart, a new bootstrap or Envoy binary is applied by an Envoy hot restart (#25)")
	envMeshagentEnvoyAnswersReadiness = setting(asBool, "MESHAGENT_ENVOY_ANSWERS_READINESS", true, svcEnvoy, "ours: Envoy's 15021 answers /healthz/ready itself while the agent has said it is ready; false forwards every probe to the agent, as Istio's bootstrap does (#36)")
	envMeshagentChaos                 = setting(asBool, "MESHAGENT_CHAOS", false, svcStatus, "ours: proxy --chaos, POST /debug/chaos/kill on the status port")
	envMeshagentMesh                  = setting(asText("path"), "MESHAGENT_MESH", "", svcStandalone, "ours: standalone --mesh, the mesh the control plane serves")
	envMeshagentCertLifetime          = setting(asDuration, "MESHAGENT_CERT_LIFETIME", 1*time.Minute, svcStandalone, "ours: standalone --cert-lifetime (short, so that a rotation shows within a minute)")
	// The embedded peers' ports are istiod's (15010, 15012) moved out of
	// 15000-15090, where the agent's and Envoy's own ports live.
	envMeshagentControlplaneListen = setting(asHostPort, "MESHAGENT_CONTROLPLANE_LISTEN", "127.0.0.1:16010", svcStandalone, "ours: standalone --controlplane-listen")
	envMeshagentCAListen           = setting(asHostPort, "MESHAGENT_CA_LISTEN", "127.0.0.1:16012", svcStandalone, "ours: standalone --ca-listen")

	// A VM (istio-start.sh's variables, from cluster.env and sidecar.env).
	envIstioClusterConfig   = setting(asText("path"), "ISTIO_CLUSTER_CONFIG", "./var/lib/istio/envoy/cluster.env", svcVM, "--cluster-env: the VM's settings")
	envIstioSidecarConfig   = setting(asText("path"), "ISTIO_SIDECAR_CONFIG", "./var/lib/istio/envoy/sidecar.env", svcVM, "--sidecar-env: the VM's optional local settings")
	envIstioCustomIPTables  = setting(asBool, "ISTIO_CUSTOM_IP_TABLES", false, svcVM, "the VM's capture rules are the operator's: none applied")
	envIstioNamespace       = setting(asText("string"), "ISTIO_NAMESPACE", "default", svcVM, "the VM's POD_NAMESPACE")
	envIstioSVCIP           = setting(asIP, "ISTIO_SVC_IP", "", svcVM, "the VM's INSTANCE_IP")
	envIstioSystemNamespace = setting(asText("string"), "ISTIO_SYSTEM_NAMESPACE", "istio-system", svcVM, "istiod's namespace, in the default CA_ADDR")
	envPilotAddress         = setting(asHostPort, "PILOT_ADDRESS", "", svcVM, "istiod's address: discoveryAddress and CA_ADDR")
	envIstioPilotPort       = setting(asOptionalPort, "ISTIO_PILOT_PORT", 0, svcVM, "istiod's port, when PILOT_ADDRESS is unset")
	envIstioService         = setting(asText("string"), "ISTIO_SERVICE", "rawvm", svcVM, "the VM's serviceCluster")
	envIstioCPAuth          = setting(asText("string"), "ISTIO_CP_AUTH", "MUTUAL_TLS", svcVM, "the VM's controlPlaneAuthPolicy")

	// The process.
	envGOGC           = setting(asGCPercent, "GOGC", 50, svcProcess, "Go's GC target; unset, the agent sets this one (any value, even empty, is left to Go's runtime)")
	envIdleGOMAXPROCS = setting(asCount, "MESHAGENT_IDLE_GOMAXPROCS", 1, svcProcess, "ours: Go's parallelism while the agent is idle, once first ready; under load it takes GOMAXPROCS (Istio's injector sets it from the CPU limit) or Go's own back, read at each GC; 0: always that (#36)")
	envGODEBUG        = setting(asText("settings"), "GODEBUG", "updatemaxprocs=0", svcProcess, "Go's runtime settings (Go's runtime reads them); the binary's own default turns off the once-a-second CPU-limit check (#36), updatemaxprocs=1 turns it on")
	envGOMEMLIMIT     = setting(asText("bytes or off"), "GOMEMLIMIT", "", svcProcess, "Go's soft memory limit (Go's runtime reads it); set, AUTOMEMLIMIT does nothing")
	envAUTOMEMLIMIT   = setting(asMemoryLimitRatio, "AUTOMEMLIMIT", 0.9, svcProcess, "Go's memory limit as this share of the cgroup's memory limit, as Istio's agent (automemlimit); off: none")
	envNotifySocket   = setting(asText("path"), "NOTIFY_SOCKET", "", svcProcess, "systemd's readiness socket (read by go-systemd in tree)")
	envWatchdogUSEC   = setting(asText("count"), "WATCHDOG_USEC", "", svcProcess, "systemd's watchdog interval (read by go-systemd in tree)")
)

// Vars is the table as help prints it, sorted by name.
func Vars() []Var {
	out := make([]Var, 0, len(table))
	for _, e := range table {
		out = append(out, e.row())
	}
	slices.SortFunc(out, func(a, b Var) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// WriteTable prints the table, sorted: name (a prefix as NAME*), default,
// type, service, doc. It is `meshagent help env`.
func WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIABLE\tDEFAULT\tSERVICE\tMEANING")
	for _, v := range Vars() {
		name := v.Name
		if v.Prefix {
			name += "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, v.Default, v.Service, v.Doc)
	}
	return tw.Flush()
}
