// Package config is the agent's configuration apart from its commands
// (#26): the translation of Istio's flags, environment variables,
// ProxyConfig layers, mesh config file, pod files and a VM's cluster.env
// into the tree's Config (Build, BuildStandalone, ReadVM); the one table
// of every environment variable the agent reads (Env), the Reader through
// which each is read, and the parsers shared by flags and variables.
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
	"strings"
	"text/tabwriter"
)

// Var is one environment variable the agent reads: its name (for a prefix,
// the prefix, with Prefix set), its default as `help env` shows it, the
// type its parser takes, the service it feeds and what it means (Istio's
// meaning, unless Service says it is ours).
type Var struct {
	Name    string
	Default string
	Type    string
	Service string
	Doc     string
	// Prefix: every variable whose name starts with Name (ISTIO_META_*).
	Prefix bool
}

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

// Env is every environment variable the agent reads. A variable read
// anywhere else is a bug: TestEveryReadIsInTheTable checks a full start's
// reads against it, and TestEnvTableMatchesReference the docs' table.
var Env = []Var{
	// The pod: who the workload is (Istio's injector sets these).
	{Name: "POD_NAME", Type: "string", Service: svcPod, Doc: "the pod's name: node id, metadata"},
	{Name: "POD_NAMESPACE", Type: "DNS label", Service: svcPod, Doc: "the pod's namespace: node id, DNS domain, SPIFFE ID"},
	{Name: "SERVICE_ACCOUNT", Type: "DNS subdomain", Service: svcPod, Doc: "the pod's service account: SPIFFE ID"},
	{Name: "INSTANCE_IP", Type: "IP list", Service: svcPod, Doc: "the pod's IPs, comma separated, before the host's: node id, probes' destination"},
	{Name: "PROXY_CONFIG", Type: "YAML or JSON", Service: svcPod, Doc: "a ProxyConfig layer over the mesh config file's defaultConfig"},
	{Name: "ISTIO_CPU_LIMIT", Default: "0", Type: "count", Service: svcEnvoy, Doc: "Envoy's --concurrency when ProxyConfig sets none"},

	// Envoy: its bootstrap, command line and process.
	{Name: "ISTIO_META_", Type: "string", Service: svcEnvoy, Prefix: true, Doc: "Envoy node metadata, one key per variable"},
	{Name: "ISTIO_METAJSON_", Type: "JSON object", Service: svcEnvoy, Prefix: true, Doc: "Envoy node metadata merged from a JSON object (_LABELS: the static labels)"},
	{Name: "ENVOY_STATUS_PORT", Default: "15021", Type: "port", Service: svcEnvoy, Doc: "Envoy's readiness listener, forwarding to the agent"},
	{Name: "ENVOY_PROMETHEUS_PORT", Default: "15090", Type: "port", Service: svcEnvoy, Doc: "Envoy's Prometheus listener, merged into :15020/stats/prometheus"},
	{Name: "ENVOY_SECURE_METRICS_PORT", Default: "0 (off)", Type: "port or 0", Service: svcEnvoy, Doc: "Envoy's mTLS metrics listener"},
	{Name: "ENVOY_SECURE_MERGED_METRICS_PORT", Default: "0 (off)", Type: "port or 0", Service: svcEnvoy, Doc: "Envoy's mTLS listener for the merged metrics"},
	{Name: "ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL", Default: "false", Type: "bool", Service: svcEnvoy, Doc: "the readiness listener accepts the PROXY protocol"},
	{Name: "ISTIO_BOOTSTRAP", Type: "path", Service: svcEnvoy, Doc: "the bootstrap template, instead of the built-in one"},
	{Name: "ISTIO_BOOTSTRAP_OVERRIDE", Type: "path", Service: svcEnvoy, Doc: "a file given to Envoy as --config-yaml, over the bootstrap"},
	{Name: "HOST_IP", Type: "string", Service: svcEnvoy, Doc: "the node's IP, in the bootstrap (tracing, stats sinks)"},
	{Name: "ISTIO_DELTA_XDS", Default: "true", Type: "bool", Service: svcEnvoy, Doc: "Envoy's ADS is delta (incremental) xDS"},
	{Name: "ISTIO_DUAL_STACK", Default: "false", Type: "bool", Service: svcEnvoy, Doc: "listeners for both IP families; istio-iptables' --dual-stack"},
	{Name: "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", Default: "false", Type: "bool", Service: svcEnvoy, Doc: "drain until Envoy's active connections reach zero"},
	{Name: "MINIMUM_DRAIN_DURATION", Default: "5s", Type: "duration", Service: svcEnvoy, Doc: "the shortest drain with EXIT_ON_ZERO_ACTIVE_CONNECTIONS (0: none)"},
	{Name: "PEER_METADATA_DISCOVERY", Default: "ISTIO_META_ENABLE_HBONE", Type: "bool", Service: svcEnvoy, Doc: "the metadata_discovery extension and METADATA_DISCOVERY metadata"},
	{Name: "ENVOY_SKIP_DEPRECATED_LOGS", Default: "true", Type: "bool", Service: svcEnvoy, Doc: "Envoy's --skip-deprecated-logs"},
	{Name: "ISTIO_ENVOY_ENABLE_CORE_DUMP", Default: "false", Type: "bool", Service: svcEnvoy, Doc: "Envoy's --enable-core-dump"},
	{Name: "DISABLE_ENVOY", Default: "false", Type: "bool", Service: svcEnvoy, Doc: "no Envoy (proxyless gRPC): the agent serves xDS and certificates only"},
	{Name: "COMPLIANCE_POLICY", Type: "string", Service: svcEnvoy, Doc: "TLS compliance policy (fips-140-2) in the bootstrap"},
	{Name: "HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED", Default: "true", Type: "bool", Service: svcEnvoy, Doc: "false keeps a URL's #fragment in the path"},
	{Name: "CLOUD_PLATFORM", Type: "string", Service: svcEnvoy, Doc: "the platform whose metadata goes in the node (gcp; none)"},
	{Name: "GCP_METADATA", Type: "string", Service: svcEnvoy, Doc: "GCP's project|number|cluster|location, instead of the metadata server"},
	{Name: "GCP_QUOTA_PROJECT", Type: "string", Service: svcEnvoy, Doc: "GCP's quota project, in the node metadata"},
	{Name: "GCP_ZONE", Type: "string", Service: svcEnvoy, Doc: "GCP's zone, in the node's locality"},

	// Certificates and SDS.
	{Name: "PILOT_CERT_PROVIDER", Default: "istiod", Type: "string", Service: svcCerts, Doc: "where the certificates come from (istiod, kubernetes, k8s.io/<signer>, custom, none)"},
	{Name: "CA_ADDR", Default: "discoveryAddress", Type: "host:port", Service: svcCerts, Doc: "the CA's address"},
	{Name: "CA_ROOT_CA", Default: "./var/run/secrets/istio/root-cert.pem", Type: "path or SYSTEM", Service: svcCerts, Doc: "the roots verifying the CA"},
	{Name: "CA_HEADER_", Type: "string", Service: svcCerts, Prefix: true, Doc: "gRPC headers on CSRs, one per variable"},
	{Name: "ISTIOD_SAN", Type: "string", Service: svcCerts + ", " + svcXDS, Doc: "the name verified on istiod's certificate"},
	{Name: "PROV_CERT", Type: "path", Service: svcCerts + ", " + svcXDS, Doc: "directory of a provisioning certificate (a VM's): its root verifies the CA and istiod, its cert-chain.pem and key.pem are the client certificate to both"},
	{Name: "OUTPUT_CERTS", Type: "path", Service: svcCerts + ", " + svcXDS, Doc: "directory the workload certificate is written to (and proxyless gRPC reads)"},
	{Name: "FILE_MOUNTED_CERTS", Default: "false", Type: "bool", Service: svcCerts, Doc: "certificates come from files only, never the CA"},
	{Name: "FILE_DEBOUNCE_DURATION", Default: "100ms", Type: "duration", Service: svcCerts + ", " + svcSDS, Doc: "quiet time before changed certificate files are reloaded"},
	{Name: "ISTIO_META_CLUSTER_ID", Type: "string", Service: svcCerts + ", " + svcXDS, Doc: "the cluster, in CSRs and xDS requests (and node metadata)"},
	{Name: "ISTIO_META_CERT_SIGNER", Type: "string", Service: svcCerts, Doc: "the signer asked for in CSRs"},
	{Name: "TRUST_DOMAIN", Default: "cluster.local", Type: "trust domain", Service: svcCerts, Doc: "the SPIFFE trust domain"},
	{Name: "SECRET_TTL", Default: "24h", Type: "duration", Service: svcCerts, Doc: "the workload certificate's requested lifetime"},
	{Name: "SECRET_GRACE_PERIOD_RATIO", Default: "0.5", Type: "number", Service: svcCerts, Doc: "renew when this share of the lifetime is left"},
	{Name: "SECRET_GRACE_PERIOD_RATIO_JITTER", Default: "0.01", Type: "number", Service: svcCerts, Doc: "random spread of the renewal time"},
	{Name: "WORKLOAD_RSA_KEY_SIZE", Default: "2048", Type: "count", Service: svcCerts, Doc: "RSA key size"},
	{Name: "ECC_SIGNATURE_ALGORITHM", Default: "RSA", Type: "ECDSA or RSA", Service: svcCerts, Doc: "the workload key's algorithm"},
	{Name: "ECC_CURVE", Default: "P256", Type: "P256 or P384", Service: svcCerts, Doc: "the ECDSA curve"},
	{Name: "PKCS8_KEY", Default: "false", Type: "bool", Service: svcCerts, Doc: "the key is written as PKCS#8"},
	{Name: "KUBERNETES_SERVICE_HOST", Type: "string", Service: svcCerts, Doc: "set on Kubernetes: OUTPUT_CERTS files are 0644"},
	{Name: "WORKLOAD_IDENTITY_SOCKET_FILE", Default: "socket", Type: "file name", Service: svcSDS + ", " + svcEnvoy, Doc: "the SDS socket's name in ./var/run/secrets/workload-spiffe-uds"},
	{Name: "PILOT_ENABLE_CA_CRL", Default: "true", Type: "bool", Service: svcSDS, Doc: "serve the CA's CRL (./var/run/secrets/istio/crl) with the roots"},

	// The XDS proxy.
	{Name: "XDS_ROOT_CA", Type: "path or SYSTEM", Service: svcXDS, Doc: "the roots verifying istiod (else ./etc/certs, PROV_CERT, the CA root)"},
	{Name: "XDS_HEADER_", Type: "string", Service: svcXDS, Prefix: true, Doc: "gRPC headers on the upstream xDS stream, one per variable"},
	{Name: "GRPC_KEEPALIVE_INTERVAL", Default: "30s", Type: "duration", Service: svcXDS, Doc: "keepalive pings on the upstream stream"},
	{Name: "GRPC_KEEPALIVE_TIMEOUT", Default: "10s", Type: "duration", Service: svcXDS, Doc: "keepalive ping timeout"},
	{Name: "PROXY_CONFIG_XDS_AGENT", Default: "false", Type: "bool", Service: svcXDS, Doc: "ask istiod for ProxyConfig (its caCertificatesPem)"},
	{Name: "XDS_OFFLINE_CACHE", Default: "true", Type: "bool", Service: svcXDS, Doc: "ours: keep Envoy's last ACKed config and serve it while istiod is away"},
	{Name: "GRPC_XDS_BOOTSTRAP", Default: "./etc/istio/proxy/grpc-bootstrap.json", Type: "path", Service: svcXDS, Doc: "where proxyless gRPC's bootstrap is written"},

	// The DNS proxy.
	{Name: "ISTIO_META_DNS_CAPTURE", Default: "false", Type: "bool", Service: svcDNS + ", " + svcCapture, Doc: "the DNS proxy on, and DNS redirected to it (sidecars)"},
	{Name: "ISTIO_META_ENABLE_DNS_SERVER", Default: "false", Type: "bool", Service: svcDNS, Doc: "the DNS proxy on, without capture"},
	{Name: "DNS_PROXY_ADDR", Default: "localhost:15053", Type: "host:port", Service: svcDNS + ", " + svcEnvoy, Doc: "the DNS proxy's address (loopback only); in the node metadata as set"},
	{Name: "DNS_FORWARD_TIMEOUT", Default: "5s", Type: "duration", Service: svcDNS, Doc: "timeout of a query forwarded upstream"},
	{Name: "DNS_FORWARD_PARALLEL", Default: "false", Type: "bool", Service: svcDNS, Doc: "forward to every upstream at once, first answer wins"},

	// The status server.
	{Name: "ISTIO_KUBE_APP_PROBERS", Type: "JSON", Service: svcStatus, Doc: "the application's probes, answered on /app-health/..."},
	{Name: "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", Default: "false", Type: "bool", Service: svcStatus, Doc: "probes go to localhost, not INSTANCE_IP"},
	{Name: "ISTIO_ENABLE_HTTP2_PROBING", Default: "true", Type: "bool", Service: svcStatus, Doc: "HTTP/2 for HTTPS probes"},
	{Name: "ENABLE_PROBE_KEEPALIVE_CONNECTIONS", Default: "false", Type: "bool", Service: svcStatus, Doc: "probe connections kept between probes"},
	{Name: "ISTIO_PROMETHEUS_ANNOTATIONS", Type: "JSON", Service: svcStatus, Doc: "the application's metrics merged into /stats/prometheus"},
	{Name: "PILOT_AGENT_MERGE_ENVOY_STATS", Default: "true", Type: "bool", Service: svcStatus, Doc: "Envoy's metrics merged into /stats/prometheus"},
	{Name: "METRICS_LOCALHOST_ACCESS_ONLY", Default: "false", Type: "bool", Service: svcStatus, Doc: "/stats/prometheus and /metrics answer loopback callers only"},

	// istio-iptables' flags (pkg/flag.BindEnv: UPPER_SNAKE of the flag)
	// and its variables: `istio-iptables`, `clean-iptables`, proxy --capture.
	{Name: "INBOUND_CAPTURE_PORT", Default: "15006", Type: "port", Service: svcCapture, Doc: "--inbound-capture-port: where inbound TCP is redirected"},
	{Name: "INBOUND_TUNNEL_PORT", Default: "15008", Type: "port", Service: svcCapture, Doc: "--inbound-tunnel-port: Envoy's HBONE port, never captured"},
	{Name: "PROXY_UID", Default: "uid of ENVOY_USER, else 1337", Type: "uid list", Service: svcCapture, Doc: "--proxy-uid: the proxy's uids, whose traffic is not captured"},
	{Name: "PROXY_GID", Default: "PROXY_UID", Type: "gid list", Service: svcCapture, Doc: "--proxy-gid: the proxy's gids"},
	{Name: "ENVOY_USER", Default: "istio-proxy", Type: "user", Service: svcCapture, Doc: "the user whose uid is --proxy-uid's default"},
	{Name: "ISTIO_INBOUND_INTERCEPTION_MODE", Default: "REDIRECT", Type: "REDIRECT or TPROXY", Service: svcCapture, Doc: "--istio-inbound-interception-mode"},
	{Name: "ISTIO_INBOUND_TPROXY_MARK", Default: "1337", Type: "string", Service: svcCapture, Doc: "--istio-inbound-tproxy-mark: TPROXY's packet mark"},
	{Name: "ISTIO_INBOUND_TPROXY_ROUTE_TABLE", Default: "133", Type: "string", Service: svcCapture, Doc: "--istio-inbound-tproxy-route-table: TPROXY's routing table"},
	{Name: "ISTIO_INBOUND_PORTS", Type: "port list or *", Service: svcCapture, Doc: "--istio-inbound-ports: inbound ports captured"},
	{Name: "ISTIO_LOCAL_EXCLUDE_PORTS", Type: "port list", Service: svcCapture, Doc: "--istio-local-exclude-ports: inbound ports not captured"},
	{Name: "ISTIO_EXCLUDE_INTERFACES", Type: "list", Service: svcCapture, Doc: "--istio-exclude-interfaces: interfaces never captured"},
	{Name: "ISTIO_SERVICE_CIDR", Type: "CIDR list or *", Service: svcCapture, Doc: "--istio-service-cidr: outbound ranges captured"},
	{Name: "ISTIO_SERVICE_EXCLUDE_CIDR", Type: "CIDR list", Service: svcCapture, Doc: "--istio-service-exclude-cidr: outbound ranges never captured"},
	{Name: "ISTIO_OUTBOUND_PORTS", Type: "port list", Service: svcCapture, Doc: "--istio-outbound-ports: outbound ports always captured"},
	{Name: "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE", Type: "port list", Service: svcCapture, Doc: "--istio-local-outbound-ports-exclude: outbound ports never captured"},
	{Name: "KUBE_VIRT_INTERFACES", Type: "list", Service: svcCapture, Doc: "--kube-virt-interfaces: inbound on them treated as outbound"},
	{Name: "DRY_RUN", Default: "false", Type: "bool", Service: svcCapture, Doc: "--dry-run: print the rules, change nothing"},
	{Name: "IPTABLES_PROBE_PORT", Default: "15002", Type: "port", Service: svcCapture, Doc: "--iptables-probe-port: the validation probe's port"},
	{Name: "PROBE_TIMEOUT", Default: "5s", Type: "duration", Service: svcCapture, Doc: "--probe-timeout: the validation probe's timeout"},
	{Name: "SKIP_RULE_APPLY", Default: "false", Type: "bool", Service: svcCapture, Doc: "--skip-rule-apply: validate only"},
	{Name: "RUN_VALIDATION", Default: "false", Type: "bool", Service: svcCapture, Doc: "--run-validation: check capture with a probe connection"},
	{Name: "REDIRECT_DNS", Default: "ISTIO_META_DNS_CAPTURE", Type: "bool", Service: svcCapture, Doc: "--redirect-dns: DNS redirected to the DNS proxy"},
	{Name: "DROP_INVALID", Default: "INVALID_DROP", Type: "bool", Service: svcCapture, Doc: "--drop-invalid: drop packets conntrack marks INVALID"},
	{Name: "INVALID_DROP", Default: "false", Type: "bool", Service: svcCapture, Doc: "--drop-invalid's older name"},
	{Name: "DUAL_STACK", Default: "ISTIO_DUAL_STACK", Type: "bool", Service: svcCapture, Doc: "--dual-stack: rules for IPv6 too"},
	{Name: "CAPTURE_ALL_DNS", Default: "false", Type: "bool", Service: svcCapture, Doc: "--capture-all-dns: DNS to any server, not only resolv.conf's"},
	{Name: "NETWORK_NAMESPACE", Type: "path", Service: svcCapture, Doc: "--network-namespace: the namespace programmed from outside it"},
	{Name: "CNI_MODE", Default: "false", Type: "bool", Service: svcCapture, Doc: "--cni-mode: running inside the CNI plugin"},
	{Name: "RECONCILE", Default: "false", Type: "bool", Service: svcCapture, Doc: "--reconcile: replace drifted rules"},
	{Name: "CLEANUP_ONLY", Default: "false", Type: "bool", Service: svcCapture, Doc: "--cleanup-only: only remove the rules"},
	{Name: "FORCE_APPLY", Default: "false", Type: "bool", Service: svcCapture, Doc: "--force-apply: apply even if the rules are in place"},
	{Name: "NATIVE_NFTABLES", Default: "false", Type: "bool", Service: svcCapture, Doc: "--native-nftables: nftables instead of iptables rules"},
	{Name: "FORCE_IPTABLES_BINARY", Type: "legacy or nft", Service: svcCapture, Doc: "--force-iptables-binary: the iptables flavour"},
	{Name: "ISTIO_OUTBOUND_OWNER_GROUPS", Default: "*", Type: "group list", Service: svcCapture, Doc: "groups whose outbound traffic is captured"},
	{Name: "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", Type: "group list", Service: svcCapture, Doc: "groups whose outbound traffic is not captured"},
	{Name: "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", Default: "127.0.0.1/32", Type: "CIDR", Service: svcCapture, Doc: "the loopback range outbound rules treat as local"},

	// The commands' own settings (flags first, then these).
	{Name: "MESHAGENT_ROOT", Default: "/", Type: "path", Service: svcProcess, Doc: "ours: --root, the directory every agent path lives under"},
	{Name: "MESHAGENT_CAPTURE", Default: "false", Type: "bool", Service: svcCapture, Doc: "ours: proxy --capture, the agent applies and keeps the capture rules (VM)"},
	{Name: "MESHAGENT_CAPTURE_CHECK_INTERVAL", Default: "30s", Type: "duration", Service: svcCapture, Doc: "ours: proxy --capture-check-interval"},
	{Name: "MESHAGENT_HOT_RESTART", Default: "false", Type: "bool", Service: svcEnvoy, Doc: "ours: proxy --hot-restart, a new bootstrap or Envoy binary is applied by an Envoy hot restart (#25)"},
	{Name: "MESHAGENT_CHAOS", Default: "false", Type: "bool", Service: svcStatus, Doc: "ours: proxy --chaos, POST /debug/chaos/kill on the status port"},
	{Name: "MESHAGENT_MESH", Type: "path", Service: svcStandalone, Doc: "ours: standalone --mesh, the mesh the control plane serves"},
	{Name: "MESHAGENT_CERT_LIFETIME", Default: "1m", Type: "duration", Service: svcStandalone, Doc: "ours: standalone --cert-lifetime"},
	{Name: "MESHAGENT_CONTROLPLANE_LISTEN", Default: "127.0.0.1:16010", Type: "host:port", Service: svcStandalone, Doc: "ours: standalone --controlplane-listen"},
	{Name: "MESHAGENT_CA_LISTEN", Default: "127.0.0.1:16012", Type: "host:port", Service: svcStandalone, Doc: "ours: standalone --ca-listen"},

	// A VM (istio-start.sh's variables, from cluster.env and sidecar.env).
	{Name: "ISTIO_CLUSTER_CONFIG", Default: "./var/lib/istio/envoy/cluster.env", Type: "path", Service: svcVM, Doc: "--cluster-env: the VM's settings"},
	{Name: "ISTIO_SIDECAR_CONFIG", Default: "./var/lib/istio/envoy/sidecar.env", Type: "path", Service: svcVM, Doc: "--sidecar-env: the VM's optional local settings"},
	{Name: "ISTIO_CUSTOM_IP_TABLES", Default: "false", Type: "bool", Service: svcVM, Doc: "the VM's capture rules are the operator's: none applied"},
	{Name: "ISTIO_NAMESPACE", Default: "default", Type: "string", Service: svcVM, Doc: "the VM's POD_NAMESPACE"},
	{Name: "ISTIO_SVC_IP", Type: "IP", Service: svcVM, Doc: "the VM's INSTANCE_IP"},
	{Name: "ISTIO_SYSTEM_NAMESPACE", Default: "istio-system", Type: "string", Service: svcVM, Doc: "istiod's namespace, in the default CA_ADDR"},
	{Name: "PILOT_ADDRESS", Type: "host:port", Service: svcVM, Doc: "istiod's address: discoveryAddress and CA_ADDR"},
	{Name: "ISTIO_PILOT_PORT", Type: "port", Service: svcVM, Doc: "istiod's port, when PILOT_ADDRESS is unset"},
	{Name: "ISTIO_SERVICE", Default: "rawvm", Type: "string", Service: svcVM, Doc: "the VM's serviceCluster"},
	{Name: "ISTIO_CP_AUTH", Default: "MUTUAL_TLS", Type: "string", Service: svcVM, Doc: "the VM's controlPlaneAuthPolicy"},

	// The process.
	{Name: "GOGC", Default: "50", Type: "count or off", Service: svcProcess, Doc: "Go's GC target; unset, the agent's own (50)"},
	{Name: "GOMEMLIMIT", Type: "bytes or off", Service: svcProcess, Doc: "Go's soft memory limit (Go's runtime reads it); set, AUTOMEMLIMIT does nothing"},
	{Name: "AUTOMEMLIMIT", Default: "0.9", Type: "ratio or off", Service: svcProcess, Doc: "Go's memory limit as this share of the cgroup's memory limit, as Istio's agent (automemlimit)"},
	{Name: "NOTIFY_SOCKET", Type: "path", Service: svcProcess, Doc: "systemd's readiness socket (read by go-systemd in tree)"},
	{Name: "WATCHDOG_USEC", Type: "count", Service: svcProcess, Doc: "systemd's watchdog interval (read by go-systemd in tree)"},
}

// Find is the table's entry for a name: its own entry, else the prefix
// entry it falls under; the whole environment's reads (AllVariables) and a
// prefix's (PREFIX*) are found too.
func Find(name string) (Var, bool) {
	if name == AllVariables {
		return Var{Name: AllVariables, Doc: "the whole environment"}, true
	}
	if p, ok := strings.CutSuffix(name, "*"); ok {
		i := slices.IndexFunc(Env, func(v Var) bool { return v.Prefix && v.Name == p })
		if i < 0 {
			return Var{}, false
		}
		return Env[i], true
	}
	if i := slices.IndexFunc(Env, func(v Var) bool { return !v.Prefix && v.Name == name }); i >= 0 {
		return Env[i], true
	}
	for _, v := range Env {
		if v.Prefix && strings.HasPrefix(name, v.Name) {
			return v, true
		}
	}
	return Var{}, false
}

// Sorted is the table by name.
func Sorted() []Var {
	out := slices.Clone(Env)
	slices.SortFunc(out, func(a, b Var) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// WriteTable prints the table, sorted: name (a prefix as NAME*), default,
// service, doc. It is `meshagent help env`.
func WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIABLE\tDEFAULT\tSERVICE\tMEANING")
	for _, v := range Sorted() {
		name := v.Name
		if v.Prefix {
			name += "*"
		}
		def := v.Default
		if def == "" {
			def = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, def, v.Service, v.Doc)
	}
	return tw.Flush()
}
