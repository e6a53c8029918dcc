package conformance

// The cases of the differential conformance suite: the same inputs given to
// Istio's pilot-agent and to meshagent. A case is plain data (it is stored
// with Istio's recorded output in testdata/<name>.json, so that
// `make test` replays it without Istio's binary or source).

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	meshconfig "istio.io/api/mesh/v1alpha1"
)

// Case kinds.
const (
	kindBootstrap = "bootstrap" // run `proxy`, compare Envoy's command line and bootstrap
	kindExit      = "exit"      // run a command, compare how it ends (refused, exited, started Envoy)
	kindStatus    = "status"    // run `proxy` with Envoy, compare the status codes of status paths
)

// confCase is one set of inputs.
type confCase struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	// Command follows the binary (default: proxy sidecar); meshagent's
	// `proxy` also gets --root.
	Command []string `json:"command,omitempty"`
	// Env is added to (and overrides) the base environment. "<root>" in a
	// value is the agent's own directory.
	Env map[string]string `json:"env,omitempty"`
	// ProxyConfig is PROXY_CONFIG (a JSON object) without binaryPath: the
	// suite adds the stand-in Envoy's path.
	ProxyConfig string `json:"proxy_config,omitempty"`
	// Mesh is the mesh config file (./etc/istio/config/mesh).
	Mesh string `json:"mesh,omitempty"`
	// Labels and Annotations are the Downward API files
	// (./etc/istio/pod/{labels,annotations}); nil: no file.
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// Files are more files under the agent's directory, by relative path;
	// a value "@istio:<path>" is that file of Istio's source.
	Files map[string]string `json:"files,omitempty"`
	// Addrs are the pod interface's addresses (prefixes); default
	// INSTANCE_IP/24 (/64 for IPv6).
	Addrs []string `json:"addrs,omitempty"`
	// Requests are the status requests of a status case: "GET /path" on the
	// agent's status port, "GET envoy:/path" on Envoy's ENVOY_STATUS_PORT
	// listener; a "POST /quitquitquit" last also records the exit.
	Requests []string `json:"requests,omitempty"`
	// OnPurpose names the docs/conformance.md row of a difference this case shows on
	// purpose (its outcome may differ from Istio's); "" for none.
	OnPurpose string `json:"on_purpose,omitempty"`
	// Note says what the case is about.
	Note string `json:"note,omitempty"`
}

// baseEnv is every case's environment before its own: a pod with
// file-mounted certificates (Istio's agent needs a root certificate to
// start), no cloud metadata lookups.
var baseEnv = map[string]string{
	"FILE_MOUNTED_CERTS": "true",
	"CLOUD_PLATFORM":     "none",
	"POD_NAME":           "app-0",
	"POD_NAMESPACE":      "conformance",
	"INSTANCE_IP":        "10.44.0.12",
	"SERVICE_ACCOUNT":    "default",
}

// command is the command line after the binary; "<root>" in an argument
// is the agent's own directory.
func (c confCase) command(root string) []string {
	if len(c.Command) == 0 {
		return []string{"proxy", "sidecar"}
	}
	out := make([]string, len(c.Command))
	for i, a := range c.Command {
		out[i] = strings.ReplaceAll(a, "<root>", root)
	}
	return out
}

func (c confCase) isProxy() bool { return c.command("")[0] == "proxy" }

// environment is the case's environment for an agent whose directory is
// root and whose Envoy is envoyPath.
func (c confCase) environment(root, envoyPath string) map[string]string {
	env := maps.Clone(baseEnv)
	for k, v := range c.Env {
		env[k] = strings.ReplaceAll(v, "<root>", root)
	}
	if c.ProxyConfig != "" && !strings.HasPrefix(c.ProxyConfig, "{") {
		// YAML: the stand-in's path as one more line.
		env["PROXY_CONFIG"] = c.ProxyConfig + "binaryPath: " + envoyPath + "\n"
		return env
	}
	pc := map[string]any{}
	if c.ProxyConfig != "" {
		if err := json.Unmarshal([]byte(c.ProxyConfig), &pc); err != nil {
			panic(fmt.Sprintf("case %s: proxy_config: %v", c.Name, err))
		}
	}
	pc["binaryPath"] = envoyPath
	js, _ := json.Marshal(pc)
	env["PROXY_CONFIG"] = string(js)
	return env
}

// addrs are the pod interface's addresses.
func (c confCase) addrs() []string {
	if len(c.Addrs) > 0 {
		return c.Addrs
	}
	ip := baseEnv["INSTANCE_IP"]
	if v, ok := c.Env["INSTANCE_IP"]; ok {
		ip = v
	}
	if strings.Contains(ip, ":") {
		return []string{ip + "/64"}
	}
	return []string{ip + "/24"}
}

// writeInputs writes the case's files under root (the agent's --root or
// working directory): Istio's template where Istio's agent reads it, the
// mesh config, the Downward API files, the case's own files.
func (c confCase) writeInputs(root, istioSrc string) error {
	files := map[string]string{}
	if istioSrc != "" {
		files[e2ekit.IstioTemplatePath] = "@istio:" + e2ekit.IstioTemplateSource
	}
	if c.Mesh != "" {
		files["etc/istio/config/mesh"] = c.Mesh
	}
	if c.Labels != nil {
		files["etc/istio/pod/labels"] = downwardAPI(c.Labels)
	}
	if c.Annotations != nil {
		files["etc/istio/pod/annotations"] = downwardAPI(c.Annotations)
	}
	maps.Copy(files, c.Files)
	for rel, content := range files {
		if src, ok := strings.CutPrefix(content, "@istio:"); ok {
			if istioSrc == "" {
				return errNeedsIstioSource
			}
			b, err := os.ReadFile(filepath.Join(istioSrc, src))
			if err != nil {
				return err
			}
			content = string(b)
		}
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

var errNeedsIstioSource = fmt.Errorf("the case needs a file of Istio's source (MESHAGENT_ISTIO_SRC)")

// downwardAPI writes labels or annotations as the kubelet does: key="value"
// lines, sorted.
func downwardAPI(m map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s=%q\n", k, m[k])
	}
	return b.String()
}

// conformanceCases are the suite's cases: Istio's own bootstrap golden
// inputs (from its source, when istioSrc is given), then ours.
func conformanceCases(istioSrc string) ([]confCase, error) {
	var cases []confCase
	if istioSrc != "" {
		golden, err := istioGoldenCases(istioSrc)
		if err != nil {
			return nil, err
		}
		cases = append(cases, golden...)
	}
	return append(cases, ownCases()...), nil
}

// istioGoldenInput is one of Istio's bootstrap golden tests
// (pkg/bootstrap/instance_test.go TestGolden): a testdata/<base>.proxycfg
// with that test's environment and annotations.
type istioGoldenInput struct {
	Base, proxyCfg string // proxyCfg: the .proxycfg read, when not base's
	env            map[string]string
	annotations    map[string]string
}

var istioGoldenInputs = []istioGoldenInput{
	{Base: "xdsproxy"},
	{Base: "auth"},
	{Base: "authsds"},
	{Base: "default"},
	{Base: "ambient", env: map[string]string{"ISTIO_META_ENABLE_HBONE": "true"}},
	{Base: "explicit_internal_address"},
	{Base: "running", env: runningEnv, annotations: map[string]string{"istio.io/insecurepath": `{"paths":["/metrics","/live"]}`}},
	{Base: "runningsds", env: runningEnv, annotations: map[string]string{"istio.io/insecurepath": `{"paths":["/metrics","/live"]}`}},
	{Base: "tracing_lightstep"},
	{Base: "tracing_zipkin"},
	{Base: "tracing_datadog"},
	{Base: "metrics_no_statsd"},
	{Base: "tracing_none"},
	{Base: "all"},
	{Base: "stats_inclusion", annotations: map[string]string{
		"sidecar.istio.io/statsInclusionPrefixes": "prefix1,prefix2,http.{pod_ip}_",
		"sidecar.istio.io/statsInclusionSuffixes": "suffix1,suffix2,upstream_rq_1xx,upstream_rq_2xx,upstream_rq_3xx,upstream_rq_4xx,upstream_rq_5xx," +
			"upstream_rq_time,upstream_cx_tx_bytes_total,upstream_cx_rx_bytes_total,upstream_cx_total," +
			"downstream_rq_1xx,downstream_rq_2xx,downstream_rq_3xx,downstream_rq_4xx,downstream_rq_5xx," +
			"downstream_rq_time,downstream_cx_tx_bytes_total,downstream_cx_rx_bytes_total,downstream_cx_total",
		"sidecar.istio.io/statsInclusionRegexps": `http.[0-9]*\.[0-9]*\.[0-9]*\.[0-9]*_8080.downstream_rq_time`,
		"sidecar.istio.io/extraStatTags":         "dlp_status,dlp_error",
		"sidecar.istio.io/statsHistogramBuckets": `{"istio":[1,5,10,50,100,500,1000,5000,10000],"envoy":[1,5,10,25,50,100,250,500,1000,2500,5000,10000]}`,
	}},
	{Base: "tracing_tls"},
	{Base: "tracing_tls_custom_sni"},
	{Base: "lrs", env: map[string]string{"COMPLIANCE_POLICY": "fips-140-2", "ISTIO_META_LOAD_STATS_CONFIG_JSON": `{"api_type": "GRPC", "transport_api_version": "V3"}`}},
	{Base: "stats_flush_interval", annotations: map[string]string{"sidecar.istio.io/statsFlushInterval": "10s"}},
	{Base: "stats_eviction_interval", annotations: map[string]string{"sidecar.istio.io/statsEvictionInterval": "10s"}},
	{Base: "invalid_stats_eviction_interval", annotations: map[string]string{"sidecar.istio.io/statsEvictionInterval": "11s"}},
	{Base: "stats_interval", annotations: map[string]string{"sidecar.istio.io/statsFlushInterval": "10s", "sidecar.istio.io/statsEvictionInterval": "20s"}},
	{Base: "global_downstream_max_connections_meta", env: map[string]string{"ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS": "10000"}},
	{Base: "global_downstream_max_connections_runtime"},
	{Base: "global_downstream_max_connections_both", env: map[string]string{"ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS": "20000"}},
	{Base: "stats_compression"},
	{Base: "secure_metrics", proxyCfg: "default", env: map[string]string{"ENVOY_SECURE_METRICS_PORT": "15091", "ENVOY_SECURE_MERGED_METRICS_PORT": "15092"}},
}

var runningEnv = map[string]string{
	"ISTIO_META_ISTIO_PROXY_SHA":   "istio-proxy:sha",
	"ISTIO_META_INTERCEPTION_MODE": "REDIRECT",
	"ISTIO_META_ISTIO_VERSION":     "release-3.1",
	"ISTIO_META_POD_NAME":          "svc-0-0-0-6944fb884d-4pgx8",
	"POD_NAME":                     "svc-0-0-0-6944fb884d-4pgx8",
	"POD_NAMESPACE":                "test",
	"INSTANCE_IP":                  "10.10.10.1",
	"ISTIO_METAJSON_LABELS":        `{"version": "v1alpha1", "app": "test", "istio-locality":"regionA.zoneB.sub_zoneC"}`,
}

// istioGoldenCases turns Istio's golden inputs into cases for real agents.
// What Istio's test passes directly becomes the input an agent reads it
// from: the ProxyConfig the mesh file's defaultConfig (configPath under the
// agent's directory), the instance IPs INSTANCE_IP and the pod interface's
// addresses, the outlier log path the flag, the annotations the Downward
// API file (and ISTIO_METAJSON_ANNOTATIONS, as the test's environment has
// them), ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS also proxyMetadata.
// Istio's test names its node sidecar~1.2.3.4~foo~bar: POD_NAME foo,
// POD_NAMESPACE bar.
func istioGoldenCases(istioSrc string) ([]confCase, error) {
	var cases []confCase
	for _, in := range istioGoldenInputs {
		name := in.proxyCfg
		if name == "" {
			name = in.Base
		}
		text, err := os.ReadFile(filepath.Join(istioSrc, "pkg/bootstrap/testdata", name+".proxycfg"))
		if err != nil {
			return nil, err
		}
		pc := &meshconfig.ProxyConfig{}
		if err := prototext.Unmarshal(text, pc); err != nil {
			return nil, fmt.Errorf("%s.proxycfg: %w", name, err)
		}
		pc.ConfigPath = "./etc/istio/proxy"
		if v, ok := in.env["ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS"]; ok {
			if pc.ProxyMetadata == nil {
				pc.ProxyMetadata = map[string]string{}
			}
			pc.ProxyMetadata["ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS"] = v
		}
		js, err := protojson.Marshal(pc)
		if err != nil {
			return nil, err
		}
		// protojson varies its spacing from build to build: the case is stored, so make it stable.
		var v any
		if err := json.Unmarshal(js, &v); err != nil {
			return nil, err
		}
		if js, err = json.Marshal(v); err != nil {
			return nil, err
		}
		env := map[string]string{
			"POD_NAME": "foo", "POD_NAMESPACE": "bar", "INSTANCE_IP": "10.3.3.3",
			"ISTIO_METAJSON_LABELS": "{}",
		}
		if in.annotations != nil {
			a, _ := json.Marshal(in.annotations)
			env["ISTIO_METAJSON_ANNOTATIONS"] = string(a)
		}
		maps.Copy(env, in.env)
		cases = append(cases, confCase{
			Name:        "istio-golden-" + strings.ReplaceAll(in.Base, "_", "-"),
			Kind:        kindBootstrap,
			Command:     []string{"proxy", "sidecar", "--outlierLogPath", "/dev/stdout"},
			Env:         env,
			Mesh:        `{"defaultConfig": ` + string(js) + "}\n",
			Annotations: in.annotations,
			Addrs:       []string{env["INSTANCE_IP"] + "/24", "10.4.4.4/24", "10.5.5.5/24", "10.6.6.6/24"},
			Note:        "Istio's bootstrap golden input pkg/bootstrap/testdata/" + name + ".proxycfg with TestGolden's environment and annotations",
		})
	}
	return cases, nil
}

// ownCases are the suite's own cases: every input layer and variable of the
// bootstrap, the proxy types, the command line's inputs, bad input, status.
func ownCases() []confCase {
	boot := func(name, note string, c confCase) confCase {
		c.Name, c.Kind, c.Note = name, kindBootstrap, note
		return c
	}
	exit := func(name, note string, c confCase) confCase {
		c.Name, c.Kind, c.Note = name, kindExit, note
		return c
	}
	return []confCase{
		boot("sidecar-defaults", "a sidecar with nothing but the pod's identity", confCase{}),
		boot("router", "proxy router (a gateway)", confCase{Command: []string{"proxy", "router"}}),
		boot("waypoint", "proxy waypoint: delta xDS and metadata discovery always", confCase{Command: []string{"proxy", "waypoint"}}),
		boot("mesh-file", "ProxyConfig from the mesh config file's defaultConfig", confCase{Mesh: `defaultConfig:
  drainDuration: 30s
  discoveryAddress: istiod-canary.istio-system.svc:15012
  concurrency: 3
  extraStatTags: [request_protocol, upstream_cluster]
  proxyStatsMatcher:
    inclusionPrefixes: [cluster.outbound]
    inclusionSuffixes: [upstream_rq_timeout]
    inclusionRegexps: ['.*osconfig.*']
  proxyMetadata:
    ISTIO_META_FROM_MESH: "yes"
    OTHER: "not metadata"
  runtimeValues:
    envoy.reloadable_features.example: "true"
    some.number: "42"
  meshId: ignored-here
trustDomain: example.org
`}),
		boot("proxy-config-env", "ProxyConfig from PROXY_CONFIG: ports, durations, file flushing, tracing, stat name length", confCase{
			ProxyConfig: `{"proxyAdminPort":15100,"statusPort":15120,"drainDuration":"12s","terminationDrainDuration":"7s","fileFlushInterval":"2.5s",` +
				`"fileFlushMinSizeKb":128,"statNameLength":250,"tracing":{"zipkin":{"address":"zipkin.istio-system:9411"},"sampling":10},` +
				`"controlPlaneAuthPolicy":"NONE","discoveryAddress":"istiod.istio-system.svc:15010","serviceCluster":"reviews"}`}),
		boot("proxy-config-yaml", "PROXY_CONFIG in YAML over a mesh file", confCase{
			ProxyConfig: "concurrency: 1\ndrainDuration: 33s\nproxyMetadata:\n  ISTIO_META_FROM_YAML: \"true\"\n",
			Mesh:        "defaultConfig:\n  holdApplicationUntilProxyStarts: true\n"}),
		boot("annotation-proxy-config", "ProxyConfig from the proxy.istio.io/config annotation, discoveryAddress and status port annotations", confCase{
			Annotations: map[string]string{
				"proxy.istio.io/config":               "concurrency: 2\ndrainDuration: 20s\nproxyMetadata:\n  ISTIO_META_FROM_ANNOTATION: \"1\"\n",
				"sidecar.istio.io/discoveryAddress":   "istiod-east.istio-system.svc:15012",
				"status.sidecar.istio.io/port":        "15220",
				"sidecar.istio.io/statsFlushInterval": "15s",
			}}),
		boot("layered-proxy-config", "the same fields in the mesh file, PROXY_CONFIG and the annotation: the later layer wins, maps merge", confCase{
			Mesh:        "defaultConfig:\n  drainDuration: 10s\n  concurrency: 4\n  proxyMetadata: {A: mesh, B: mesh}\n",
			ProxyConfig: `{"drainDuration":"11s","proxyMetadata":{"B":"env","C":"env"}}`,
			Annotations: map[string]string{"proxy.istio.io/config": `{"drainDuration":"12s","proxyMetadata":{"C":"annotation"}}`},
		}),
		boot("istio-meta", "ISTIO_META_* variables, typed by Istio (ports, booleans, lists) and not", confCase{Env: map[string]string{
			"ISTIO_META_CLUSTER_ID": "Kubernetes", "ISTIO_META_NETWORK": "net-1", "ISTIO_META_MESH_ID": "cluster.local",
			"ISTIO_META_INTERCEPTION_MODE": "TPROXY", "ISTIO_META_WORKLOAD_NAME": "reviews-v1",
			"ISTIO_META_OWNER":          "kubernetes://apis/apps/v1/namespaces/conformance/deployments/reviews-v1",
			"ISTIO_META_APP_CONTAINERS": "reviews,sidecar", "ISTIO_META_NODE_NAME": "node-7",
			"ISTIO_META_POD_PORTS": `[{"name":"http","containerPort":9080,"protocol":"TCP"}]`,
			"ISTIO_META_HTTP10":    "1", "ISTIO_META_REQUESTED_NETWORK_VIEW": "net-1,net-2",
			"ISTIO_META_CUSTOM_THING": "some value", "ISTIO_META_lower_case": "x",
			"ISTIO_META_ISTIO_PROXY_SHA":     "sha",
			"ISTIO_META_UNPRIVILEGED_POD":    "true",
			"ISTIO_META_ENABLE_HBONE":        "false",
			"ISTIO_META_DNS_AUTO_ALLOCATE":   "true",
			"ISTIO_META_ISTIO_REVISION":      "canary",
			"ISTIO_META_TLS_CLIENT_KEY":      "/etc/certs/key.pem",
			"ISTIO_META_CERT_SIGNER":         "signer-a",
			"ISTIO_META_SIDECAR_VERSION":     "v1",
			"ISTIO_META_STS_PORT":            "15463",
			"ISTIO_META_IDLE_TIMEOUT":        "5s",
			"ISTIO_META_AUTO_REGISTER_GROUP": "vm-group",
		}}),
		boot("istio-metajson", "ISTIO_METAJSON_* objects merged into the metadata", confCase{Env: map[string]string{
			"ISTIO_METAJSON_LABELS":      `{"app":"ratings","version":"v2"}`,
			"ISTIO_METAJSON_ANNOTATIONS": `{"sidecar.istio.io/inject":"true"}`,
			"ISTIO_METAJSON_EXTRA":       `{"NESTED":{"a":[1,2,{"b":true}]},"FLAG":false,"COUNT":3}`,
			"ISTIO_METAJSON_BROKEN":      `{not json`,
		}}),
		boot("downward-api", "labels and annotations files: pod-template-hash dropped, istio-locality, stats annotations", confCase{
			Labels: map[string]string{"app": "reviews", "version": "v1", "pod-template-hash": "5d4b9c8f7", "istio-locality": "us-east1.us-east1-b.rack7",
				"service.istio.io/canonical-name": "reviews", "security.istio.io/tlsMode": "istio"},
			Annotations: map[string]string{
				"sidecar.istio.io/extraStatTags":          "upstream_proxy_version,source_mesh_id",
				"sidecar.istio.io/statsInclusionPrefixes": "http.{pod_ip}_,cluster.outbound",
				"sidecar.istio.io/statsInclusionSuffixes": "upstream_rq_total",
				"sidecar.istio.io/statsHistogramBuckets":  `{"cluster_manager":[1,5,10],"istiocustom":[1,10,100]}`,
				"kubernetes.io/config.seen":               "2026-11-21T10:00:00.000000000Z",
			},
		}),
		boot("labels-file-and-metajson", "ISTIO_METAJSON_LABELS and the labels file together", confCase{
			Env:    map[string]string{"ISTIO_METAJSON_LABELS": `{"app":"from-env","only-env":"1","istio-locality":"r1.z1"}`},
			Labels: map[string]string{"app": "from-file", "only-file": "2"},
		}),
		boot("locality-metajson", "locality from ISTIO_METAJSON_LABELS alone", confCase{
			Env: map[string]string{"ISTIO_METAJSON_LABELS": `{"app":"a","istio-locality":"region.zone.sub"}`},
		}),
		boot("stats-annotations", "flush and eviction intervals, regexps, a bad histogram annotation, and statsCompression, which is no annotation of Istio's", confCase{Annotations: map[string]string{
			"sidecar.istio.io/statsFlushInterval":    "15s",
			"sidecar.istio.io/statsCompression":      "false",
			"sidecar.istio.io/statsInclusionRegexps": `.*circuit_breakers.*,http\..*\.rbac\..*`,
			"sidecar.istio.io/statsHistogramBuckets": `{"istio": [1, "two"]}`,
			"sidecar.istio.io/statsEvictionInterval": "2m",
		}}),
		boot("stats-proxy-config", "stats settings in ProxyConfig: compression off, matcher, extra tags", confCase{
			ProxyConfig: `{"statsCompression":false,"extraStatTags":["a_tag","b_tag","a_tag"],"proxyStatsMatcher":{"inclusionSuffixes":["upstream_rq_pending_active"]}}`}),
		boot("dns-capture", "ISTIO_META_DNS_CAPTURE=true: the DNS proxy runs", confCase{Env: map[string]string{"ISTIO_META_DNS_CAPTURE": "true"}}),
		boot("dns-proxy-addr", "DNS_PROXY_ADDR set, DNS capture on", confCase{Env: map[string]string{"ISTIO_META_DNS_CAPTURE": "true", "DNS_PROXY_ADDR": "127.0.0.1:15054"}}),
		boot("dns-proxy-addr-no-capture", "DNS_PROXY_ADDR set, DNS capture off", confCase{Env: map[string]string{"DNS_PROXY_ADDR": "127.0.0.1:15054"}}),
		boot("envoy-ports", "ENVOY_STATUS_PORT and ENVOY_PROMETHEUS_PORT", confCase{Env: map[string]string{"ENVOY_STATUS_PORT": "16021", "ENVOY_PROMETHEUS_PORT": "16090"}}),
		boot("exit-on-zero", "EXIT_ON_ZERO_ACTIVE_CONNECTIONS and MINIMUM_DRAIN_DURATION", confCase{Env: map[string]string{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS": "true", "MINIMUM_DRAIN_DURATION": "10s"}}),
		boot("envoy-flags-env", "ENVOY_SKIP_DEPRECATED_LOGS=false, ISTIO_ENVOY_ENABLE_CORE_DUMP=true", confCase{Env: map[string]string{"ENVOY_SKIP_DEPRECATED_LOGS": "false", "ISTIO_ENVOY_ENABLE_CORE_DUMP": "true"}}),
		boot("sotw-xds", "ISTIO_DELTA_XDS=false with HBONE: no metadata discovery over SotW", confCase{Env: map[string]string{"ISTIO_DELTA_XDS": "false", "ISTIO_META_ENABLE_HBONE": "true"}}),
		boot("peer-metadata-discovery", "PEER_METADATA_DISCOVERY=true", confCase{Env: map[string]string{"PEER_METADATA_DISCOVERY": "true"}}),
		boot("peer-metadata-discovery-off", "PEER_METADATA_DISCOVERY=false beats HBONE", confCase{Env: map[string]string{"PEER_METADATA_DISCOVERY": "false", "ISTIO_META_ENABLE_HBONE": "true"}}),
		boot("ipv6", "an IPv6-only pod", confCase{Env: map[string]string{"INSTANCE_IP": "fd00:10:44::12"}}),
		boot("dual-stack", "IPv4 and IPv6 with ISTIO_DUAL_STACK", confCase{Env: map[string]string{"ISTIO_DUAL_STACK": "true"}, Addrs: []string{"10.44.0.12/24", "fd00:10:44::12/64"}}),
		boot("dual-stack-v6-first", "IPv6 INSTANCE_IP first, with ISTIO_DUAL_STACK", confCase{Env: map[string]string{"ISTIO_DUAL_STACK": "true", "INSTANCE_IP": "fd00:10:44::12"}, Addrs: []string{"fd00:10:44::12/64", "10.44.0.12/24"}}),
		boot("mixed-families", "IPv4 and IPv6 without ISTIO_DUAL_STACK", confCase{Addrs: []string{"10.44.0.12/24", "fd00:10:44::12/64"}}),
		boot("host-addresses", "more addresses on the pod's interface than INSTANCE_IP, one public", confCase{Addrs: []string{"10.44.0.12/24", "192.0.2.7/24", "10.44.0.13/24"}}),
		boot("no-instance-ip", "no INSTANCE_IP: the interface's addresses", confCase{Env: map[string]string{"INSTANCE_IP": ""}, Addrs: []string{"10.44.0.12/24"}}),
		boot("log-levels", "--proxyLogLevel with components, --proxyComponentLogLevel, --log_as_json", confCase{
			Command: []string{"proxy", "sidecar", "--proxyLogLevel", "info,misc:error,upstream:debug,bad:a:b", "--proxyComponentLogLevel", "misc:info", "--log_as_json"}}),
		boot("component-log-level", "--proxyComponentLogLevel alone", confCase{Command: []string{"proxy", "sidecar", "--proxyLogLevel=debug", "--proxyComponentLogLevel=misc:error,upstream:info"}}),
		boot("cpu-limit", "ISTIO_CPU_LIMIT sets concurrency", confCase{Env: map[string]string{"ISTIO_CPU_LIMIT": "2"}}),
		boot("concurrency-flag", "the legacy --concurrency flag beats ProxyConfig", confCase{Command: []string{"proxy", "sidecar", "--concurrency", "4"}, ProxyConfig: `{"concurrency":2}`}),
		boot("bootstrap-override", "ISTIO_BOOTSTRAP_OVERRIDE (YAML, $(HOST_IP)) passed as --config-yaml", confCase{
			Env:   map[string]string{"ISTIO_BOOTSTRAP_OVERRIDE": "<root>/etc/istio/custom-bootstrap/custom_bootstrap.yaml", "HOST_IP": "10.128.0.5"},
			Files: map[string]string{"etc/istio/custom-bootstrap/custom_bootstrap.yaml": "tracing:\n  http:\n    name: envoy.tracers.zipkin\n    typed_config:\n      \"@type\": type.googleapis.com/envoy.config.trace.v3.ZipkinConfig\n      collector_cluster: $(HOST_IP):9411\n      collector_endpoint: /api/v2/spans\n"},
		}),
		boot("istio-template", "ISTIO_BOOTSTRAP: Istio's own envoy_bootstrap.json rendered by each agent", confCase{
			Env:         map[string]string{"ISTIO_BOOTSTRAP": "<root>/etc/istio/bootstrap/envoy_bootstrap.json", "ISTIO_META_DNS_CAPTURE": "true"},
			Files:       map[string]string{"etc/istio/bootstrap/envoy_bootstrap.json": "@istio:" + e2ekit.IstioTemplateSource},
			Annotations: map[string]string{"sidecar.istio.io/extraStatTags": "x_tag", "sidecar.istio.io/statsHistogramBuckets": `{"istio":[1,5]}`},
		}),
		boot("template-file-flag", "--templateFile with Istio's own template, a YAML-free JSON template", confCase{
			Command: []string{"proxy", "sidecar", "--templateFile", "<root>/etc/istio/bootstrap/tmpl.json"},
			Files:   map[string]string{"etc/istio/bootstrap/tmpl.json": "@istio:" + e2ekit.IstioTemplateSource},
		}),
		boot("custom-config-file", "ProxyConfig.customConfigFile: passed to Envoy unchanged", confCase{
			ProxyConfig: `{"customConfigFile":"./etc/istio/custom/envoy.json"}`,
			Files:       map[string]string{"etc/istio/custom/envoy.json": `{"admin":{"address":{"socket_address":{"address":"127.0.0.1","port_value":15000}}},"node":{"id":"custom","cluster":"custom"}}` + "\n"},
		}),
		boot("metrics-localhost", "METRICS_LOCALHOST_ACCESS_ONLY in proxyMetadata", confCase{ProxyConfig: `{"proxyMetadata":{"METRICS_LOCALHOST_ACCESS_ONLY":"true"}}`}),
		boot("canonical-name", "tracingServiceName CANONICAL_NAME_AND_NAMESPACE", confCase{
			ProxyConfig: `{"tracingServiceName":"CANONICAL_NAME_AND_NAMESPACE"}`,
			Labels:      map[string]string{"service.istio.io/canonical-name": "shop", "app": "shop-app"}}),
		boot("service-cluster-app-label", "the app label names the cluster", confCase{Labels: map[string]string{"app": "details"}}),
		boot("pilot-san-localhost", "discoveryAddress on localhost under MUTUAL_TLS: Istio's PILOT_SAN rule", confCase{ProxyConfig: `{"discoveryAddress":"localhost:15012"}`}),
		boot("outlier-log-path", "--outlierLogPath", confCase{Command: []string{"proxy", "sidecar", "--outlierLogPath", "/dev/stderr"}}),
		boot("domain-flag", "--domain", confCase{Command: []string{"proxy", "sidecar", "--domain", "conformance.svc.example.org"}}),
		boot("platform-gcp", "CLOUD_PLATFORM=gcp with GCP_METADATA: PLATFORM_METADATA", confCase{Env: map[string]string{
			"CLOUD_PLATFORM": "gcp", "GCP_METADATA": "my-project|123456789|my-cluster|us-central1-a", "GCP_QUOTA_PROJECT": "quota-project"}}),
		boot("global-max-connections-env", "ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS in the environment only", confCase{Env: map[string]string{"ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS": "100"}}),
		boot("fips", "COMPLIANCE_POLICY=fips-140-2", confCase{Env: map[string]string{"COMPLIANCE_POLICY": "fips-140-2"}}),
		boot("strip-fragment", "HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED=false", confCase{Env: map[string]string{"HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED": "false"}}),
		boot("self-discovery", "ISTIO_META_ENABLE_SELF_DISCOVERY=true: local_cluster", confCase{Env: map[string]string{"ISTIO_META_ENABLE_SELF_DISCOVERY": "true"}}),
		boot("runtime-values", "ProxyConfig.runtimeValues: remove a default, add values", confCase{
			ProxyConfig: `{"runtimeValues":{"re2.max_program_size.error_level":"","envoy.reloadable_features.x":"false","y":"text"}}`}),
		boot("istio-version-meta", "ISTIO_META_ISTIO_VERSION wins over the build's", confCase{Env: map[string]string{"ISTIO_META_ISTIO_VERSION": "1.31.0"}}),
		boot("injected-sidecar", "the container args and env of Istio's injection template (manifests/charts/istio-control/istio-discovery/files/injection-template.yaml)", confCase{
			Command: []string{"proxy", "sidecar", "--domain", "conformance.svc.cluster.local", "--proxyLogLevel=warning", "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info"},
			Env: map[string]string{
				"PILOT_CERT_PROVIDER": "istiod", "CA_ADDR": "istiod.istio-system.svc:15012", "HOST_IP": "10.128.0.5", "ISTIO_CPU_LIMIT": "2",
				"ISTIO_META_POD_PORTS":      "[\n{\"name\":\"http\",\"containerPort\":9080,\"protocol\":\"TCP\"}\n]",
				"ISTIO_META_APP_CONTAINERS": "reviews", "GOMEMLIMIT": "1073741824", "GOMAXPROCS": "2",
				"ISTIO_META_CLUSTER_ID": "Kubernetes", "ISTIO_META_NODE_NAME": "node-1", "ISTIO_META_INTERCEPTION_MODE": "REDIRECT",
				"ISTIO_META_WORKLOAD_NAME": "reviews-v1",
				"ISTIO_META_OWNER":         "kubernetes://apis/apps/v1/namespaces/conformance/deployments/reviews-v1",
				"ISTIO_META_MESH_ID":       "cluster.local", "TRUST_DOMAIN": "cluster.local",
			},
			ProxyConfig: "{}",
			Labels:      map[string]string{"app": "reviews", "version": "v1", "security.istio.io/tlsMode": "istio", "service.istio.io/canonical-name": "reviews", "service.istio.io/canonical-revision": "v1"},
			Annotations: map[string]string{"kubectl.kubernetes.io/default-container": "reviews", "sidecar.istio.io/status": `{"initContainers":["istio-init"],"containers":["istio-proxy"]}`},
		}),

		exit("bad-proxy-type", "proxy frontend: not a proxy type", confCase{Command: []string{"proxy", "frontend"}}),
		exit("bad-proxy-config-yaml", "PROXY_CONFIG that does not parse", confCase{ProxyConfig: `{"drainDuration":"forever"}`}),
		exit("bad-proxy-config-value", "PROXY_CONFIG that parses but does not validate", confCase{ProxyConfig: `{"proxyAdminPort":70000}`}),
		exit("bad-mesh-file", "a mesh config file that does not parse", confCase{Mesh: "defaultConfig: [not, a, map]\n"}),
		exit("bad-annotation-proxy-config", "a proxy.istio.io/config annotation that does not parse", confCase{Annotations: map[string]string{"proxy.istio.io/config": "drainDuration: {"}}),
		exit("bad-typed-metadata", "ISTIO_META_ENVOY_STATUS_PORT that is not a number (Istio's typed metadata)", confCase{Env: map[string]string{"ISTIO_META_ENVOY_STATUS_PORT": "abc"}}),
		exit("unknown-proxy-flag", "an unknown flag on proxy is tolerated", confCase{Command: []string{"proxy", "sidecar", "--no-such-flag=1"}}),
		exit("unknown-command", "an unknown sub-command", confCase{Command: []string{"frobnicate"}}),
		exit("version-short", "version -s", confCase{Command: []string{"version", "-s"}}),
		exit("request-bad-port", "request on a port that is not allowed", confCase{Command: []string{"request", "--debug-port", "1234", "GET", "server_info"}}),
		exit("wait-timeout", "wait for a readiness URL that never answers", confCase{Command: []string{"wait", "--timeoutSeconds", "1", "--periodMillis", "100", "--url", "http://127.0.0.1:9/healthz/ready"}}),
		exit("bad-instance-ip", "INSTANCE_IP that is not an address", confCase{Env: map[string]string{"INSTANCE_IP": "10.44.0.300"}, Addrs: []string{"10.44.0.12/24"},
			OnPurpose: "Environment variables: a malformed INSTANCE_IP is an error, not skipped"}),
		exit("bad-envoy-status-port", "ENVOY_STATUS_PORT that is not a number", confCase{Env: map[string]string{"ENVOY_STATUS_PORT": "abc"},
			OnPurpose: "Environment variables: a bad value stops the agent with exit code 2 (Istio logs it and uses the default)"}),

		{Name: "status-paths", Kind: kindStatus, Note: "the status server's answers before Envoy has config, and /quitquitquit", Requests: []string{
			"GET /healthz/ready", "GET envoy:/healthz/ready", "GET /stats/prometheus", "GET /app-health/none/livez",
			"GET /no-such-path", "GET /quitquitquit", "GET /debug/pprof/", "POST /quitquitquit"}},
	}
}
