package config

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// With nothing set, every service gets Istio's names and paths, each from
// the one table, and the SDS socket Envoy dials is the one SDS serves.
func TestPipelineUsesIstiosNamesAndPaths(t *testing.T) {
	root := testRoot(t)
	cfg, err := parseForTest(t, map[string]string{"POD_NAMESPACE": "shop"}, "--root", root)
	if err != nil {
		t.Fatal(err)
	}
	tc := cfg.Tree
	e, b := tc.Envoy, tc.Envoy.Bootstrap
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"envoy binary", e.BinaryPath, "/usr/local/bin/envoy"},
		{"admin", e.AdminAddr, "127.0.0.1:15000"},
		{"drain query", e.DrainQuery, "inboundonly&graceful"},
		{"termination drain", e.TerminationDrainDuration, 5 * time.Second},
		{"minimum drain", e.MinimumDrainDuration, 5 * time.Second},
		{"drain time", e.Args.DrainDuration, 45 * time.Second},
		{"concurrency", e.Args.Concurrency, 0},
		{"config path", b.ConfigPath, filepath.Join(root, "etc/istio/proxy")},
		{"xds socket", b.XDSSocket, filepath.Join(root, "etc/istio/proxy/XDS")},
		{"envoy's sds socket", b.SDSSocket, filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket")},
		{"sds socket", tc.SDS.SocketPath, b.SDSSocket},
		{"labels", b.LabelsFile, filepath.Join(root, "etc/istio/pod/labels")},
		{"annotations", b.AnnotationsFile, filepath.Join(root, "etc/istio/pod/annotations")},
		{"envoy status port", b.EnvoyStatusPort, 15021},
		{"envoy prometheus port", b.EnvoyPrometheusPort, 15090},
		{"domain", b.Domain, "shop.svc.cluster.local"},
		{"istio version", b.IstioVersion, testVersion},
		{"ca root", tc.Certs.CARootFile, filepath.Join(root, "var/run/secrets/istio/root-cert.pem")},
		{"token", tc.Certs.TokenFile, filepath.Join(root, "var/run/secrets/tokens/istio-token")},
		{"ca address", tc.Certs.CAAddr, "istiod.istio-system.svc:15012"},
		{"status", tc.Status.Addr, ":15020"},
		{"dns proxy", tc.DNS == nil, true},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if !slices.Contains(e.ExcludedListeners, "0.0.0.0_15021") || !slices.Contains(e.ExcludedListeners, "0.0.0.0_15090") {
		t.Errorf("excluded listeners %v lack the agent's own", e.ExcludedListeners)
	}
	// The host went in explicitly: its address follows INSTANCE_IP's absence.
	if !slices.Equal(b.InstanceIPs, []string{"10.9.8.7"}) {
		t.Errorf("node IPs = %v, want the test host's private address", b.InstanceIPs)
	}
}

// ENVOY_STATUS_PORT and ENVOY_PROMETHEUS_PORT reach Envoy's listeners, the
// node metadata (numbers, as Istio writes them) and the drain's list of the
// agent's own listeners. They used to be read and then ignored.
func TestEnvoyStatusAndPrometheusPorts(t *testing.T) {
	cfg, err := parseForTest(t, map[string]string{"ENVOY_STATUS_PORT": "25021", "ENVOY_PROMETHEUS_PORT": "25090"}, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	_, data, _ := writeEnvoyBootstrap(t, cfg)
	var boot struct {
		Node struct {
			Metadata map[string]any `json:"metadata"`
		} `json:"node"`
		StaticResources struct {
			Listeners []struct {
				Name string `json:"name"`
			} `json:"listeners"`
		} `json:"static_resources"`
	}
	if err := json.Unmarshal([]byte(data), &boot); err != nil {
		t.Fatal(err)
	}
	var listeners []string
	for _, l := range boot.StaticResources.Listeners {
		listeners = append(listeners, l.Name)
	}
	if !slices.Contains(listeners, "0.0.0.0_25021") || !slices.Contains(listeners, "0.0.0.0_25090") {
		t.Errorf("listeners %v, want 0.0.0.0_25021 and 0.0.0.0_25090", listeners)
	}
	if md := boot.Node.Metadata; md["ENVOY_STATUS_PORT"] != 25021.0 || md["ENVOY_PROMETHEUS_PORT"] != 25090.0 {
		t.Errorf("metadata ENVOY_STATUS_PORT %v, ENVOY_PROMETHEUS_PORT %v; want the numbers 25021 and 25090",
			md["ENVOY_STATUS_PORT"], md["ENVOY_PROMETHEUS_PORT"])
	}
	ex := cfg.Tree.Envoy.ExcludedListeners
	if !slices.Contains(ex, "0.0.0.0_25021") || !slices.Contains(ex, "0.0.0.0_25090") || slices.Contains(ex, "0.0.0.0_15021") {
		t.Errorf("excluded listeners %v, want the configured ports' only", ex)
	}
}

// Envoy's workers: ProxyConfig.concurrency, else ISTIO_CPU_LIMIT, else none
// (Envoy's own default); the legacy --concurrency flag, given and not 0,
// overrides both. The default ProxyConfig has no concurrency (Istio dropped
// its 2).
func TestConcurrency(t *testing.T) {
	for _, tc := range []struct {
		name string
		Env  map[string]string
		Args []string
		want string // "" = no --concurrency
	}{
		{"nothing set", nil, nil, ""},
		{"CPU limit", map[string]string{"ISTIO_CPU_LIMIT": "4"}, nil, "4"},
		{"CPU limit 0", map[string]string{"ISTIO_CPU_LIMIT": "0"}, nil, ""},
		{"ProxyConfig beats the CPU limit", map[string]string{"ISTIO_CPU_LIMIT": "4", "PROXY_CONFIG": `{"concurrency": 3}`}, nil, "3"},
		{"legacy flag beats both", map[string]string{"ISTIO_CPU_LIMIT": "4", "PROXY_CONFIG": `{"concurrency": 3}`}, []string{"--concurrency", "6"}, "6"},
		{"legacy flag 0 changes nothing", map[string]string{"ISTIO_CPU_LIMIT": "4"}, []string{"--concurrency", "0"}, "4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseForTest(t, tc.Env, append([]string{"--root", testRoot(t)}, tc.Args...)...)
			if err != nil {
				t.Fatal(err)
			}
			_, _, args := writeEnvoyBootstrap(t, cfg)
			if got := argValue(args, "--concurrency"); got != tc.want {
				t.Errorf("--concurrency %q, want %q (args %v)", got, tc.want, args)
			}
			// Istio sets ProxyConfig.concurrency itself, so that the node's
			// PROXY_CONFIG shows what Envoy runs with.
			if got := cfg.Proxy.GetConcurrency(); tc.want != "" && (got == nil || strconv.Itoa(int(got.GetValue())) != tc.want) {
				t.Errorf("ProxyConfig.concurrency = %v, want %s", got, tc.want)
			}
		})
	}
}

// PEER_METADATA_DISCOVERY is Istio's name (we used to read
// METADATA_DISCOVERY, which Istio does not).
func TestPeerMetadataDiscoveryIsReadUnderIstiosName(t *testing.T) {
	for _, tc := range []struct {
		Env  map[string]string
		want string
	}{
		{map[string]string{"PEER_METADATA_DISCOVERY": "true"}, `"METADATA_DISCOVERY": "true"`},
		{map[string]string{"METADATA_DISCOVERY": "true"}, `"METADATA_DISCOVERY": "false"`},
	} {
		cfg, err := parseForTest(t, tc.Env, "--root", testRoot(t))
		if err != nil {
			t.Fatal(err)
		}
		_, data, _ := writeEnvoyBootstrap(t, cfg)
		if !strings.Contains(data, tc.want) {
			t.Errorf("%v: bootstrap lacks %s", tc.Env, tc.want)
		}
		if ext := strings.Contains(data, `"name": "metadata_discovery"`); ext != (tc.Env["PEER_METADATA_DISCOVERY"] == "true") {
			t.Errorf("%v: metadata_discovery extension present: %v", tc.Env, ext)
		}
	}
}

// Istio's bootstrap reads METRICS_LOCALHOST_ACCESS_ONLY from
// ProxyConfig.proxyMetadata, not from the agent's environment.
func TestMetricsLocalhostOnlyComesFromProxyMetadata(t *testing.T) {
	cfg, err := parseForTest(t, map[string]string{"PROXY_CONFIG": `{"proxyMetadata": {"METRICS_LOCALHOST_ACCESS_ONLY": "true"}}`}, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Tree.Envoy.Bootstrap.MetricsLocalhostOnly {
		t.Error("proxyMetadata METRICS_LOCALHOST_ACCESS_ONLY=true did not reach the bootstrap")
	}
}

// MINIMUM_DRAIN_DURATION=0 means no minimum; only an unset variable takes
// Istio's 5s.
func TestMinimumDrainDurationZeroIsZero(t *testing.T) {
	for value, want := range map[string]time.Duration{"0": 0, "0s": 0, "250ms": 250 * time.Millisecond} {
		cfg, err := parseForTest(t, map[string]string{"MINIMUM_DRAIN_DURATION": value}, "--root", testRoot(t))
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Tree.Envoy.MinimumDrainDuration; got != want {
			t.Errorf("MINIMUM_DRAIN_DURATION=%s: %v, want %v", value, got, want)
		}
	}
}

// A sidecar drains its inbound listeners; gateways and waypoints all of
// theirs (Istio's pkg/envoy: inboundonly iff the proxy is a sidecar).
func TestDrainQueryByProxyType(t *testing.T) {
	for proxyType, want := range map[string]string{"sidecar": "inboundonly&graceful", "router": "graceful", "waypoint": "graceful"} {
		cfg, err := parseForTest(t, nil, "--root", testRoot(t), proxyType)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Tree.Envoy.DrainQuery; got != want {
			t.Errorf("proxy %s: drain query %q, want %q", proxyType, got, want)
		}
	}
}

// The host is an input: Envoy runs as 1337 only when the agent is root and
// the DNS proxy takes :53 (Istio's rule), and Envoy's environment is the
// one given.
func TestHostInputsAreExplicit(t *testing.T) {
	env := map[string]string{"ISTIO_META_DNS_CAPTURE": "true", "DNS_PROXY_ADDR": "127.0.0.1:53", "POD_NAMESPACE": "shop"}
	for euid, wantRunAs := range map[int]bool{0: true, 1337: false} {
		host := testHost(t, env)
		host.EUID = euid
		cfg, err := parseOnHost(t, host, "--root", testRoot(t))
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Tree.Envoy.RunAs != nil; got != wantRunAs {
			t.Errorf("euid %d: Envoy runs as 1337: %v, want %v", euid, got, wantRunAs)
		}
		if !slices.Contains(cfg.Tree.Envoy.Env, "DNS_PROXY_ADDR=127.0.0.1:53") || len(cfg.Tree.Envoy.Env) != len(env) {
			t.Errorf("Envoy's environment %v is not the given one", cfg.Tree.Envoy.Env)
		}
	}
}

// What is mounted or listening under the root is the host's to say
// (Host.FileExists, Host.SocketLive), not something a builder stats or dials
// (#26): a probe that says so decides the control plane's roots, an
// external SDS server and the credential socket, with nothing on disk.
func TestBuildersProbeThroughHost(t *testing.T) {
	root := testRoot(t)
	host := testHost(t, nil)
	var probed []string
	host.FileExists = func(p string) bool {
		probed = append(probed, p)
		return p == filepath.Join(root, "etc/certs/root-cert.pem")
	}
	host.SocketLive = func(p string) bool { probed = append(probed, p); return true }
	cfg, err := parseOnHost(t, host, "--root", root)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Tree.XDS.RootCAFile, filepath.Join(root, "etc/certs/root-cert.pem"); got != want {
		t.Errorf("control plane roots from %s, want the mounted %s (FileExists)", got, want)
	}
	if cfg.Tree.Certs != nil || cfg.Tree.SDS == nil || cfg.Tree.SDS.FilesSocketPath == "" {
		t.Errorf("an SDS server answers (SocketLive): certs %v, sds %+v; want no CA client, our SDS for files only", cfg.Tree.Certs, cfg.Tree.SDS)
	}
	if !cfg.Tree.Envoy.Bootstrap.CredentialSocketExists {
		t.Error("the credential socket answers (SocketLive), but the bootstrap has no credential cluster")
	}
	if len(probed) < 3 {
		t.Errorf("probes asked: %q; want the roots, the SDS socket and the credential socket", probed)
	}
}

// The pipeline leaves each service's own rules to its New, which checks
// them once, when cmd builds the tree (#26: they were checked here and
// again in New). cmd's TestServiceConfigErrorsAreUsageErrors: such an error
// still stops the start, exit 2, naming the variable.
func TestBuildLeavesServiceChecksToNew(t *testing.T) {
	cfg, err := parseForTest(t, map[string]string{"SECRET_GRACE_PERIOD_RATIO": "1.5"}, "--root", testRoot(t))
	if err != nil {
		t.Fatalf("SECRET_GRACE_PERIOD_RATIO=1.5 (a certs rule, not a parse error): %v", err)
	}
	if cfg.Tree.Certs.GraceRatio != 1.5 {
		t.Errorf("GraceRatio = %v, want 1.5 for certs.New to judge", cfg.Tree.Certs.GraceRatio)
	}
}

// Go's memory limit follows automemlimit's rule, as Istio's agent: 0.9 of
// the cgroup's by default, AUTOMEMLIMIT's ratio or "off", nothing when
// GOMEMLIMIT is set (even to a value AUTOMEMLIMIT would refuse beside it);
// a bad AUTOMEMLIMIT stops the start, named (#36).
func TestMemoryLimitRatio(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want float64
		bad  string
	}{
		{env: nil, want: 0.9},
		{env: map[string]string{"AUTOMEMLIMIT": "0.5"}, want: 0.5},
		{env: map[string]string{"AUTOMEMLIMIT": "1"}, want: 1},
		{env: map[string]string{"AUTOMEMLIMIT": "off"}, want: 0},
		{env: map[string]string{"GOMEMLIMIT": "100MiB", "AUTOMEMLIMIT": "0.5"}, want: 0},
		{env: map[string]string{"GOMEMLIMIT": "", "AUTOMEMLIMIT": "junk"}, want: 0},
		{env: map[string]string{"AUTOMEMLIMIT": "0"}, bad: "AUTOMEMLIMIT"},
		{env: map[string]string{"AUTOMEMLIMIT": "1.5"}, bad: "AUTOMEMLIMIT"},
		{env: map[string]string{"AUTOMEMLIMIT": "-0.5"}, bad: "AUTOMEMLIMIT"},
		{env: map[string]string{"AUTOMEMLIMIT": "NaN"}, bad: "AUTOMEMLIMIT"},
		{env: map[string]string{"AUTOMEMLIMIT": "90%"}, bad: "AUTOMEMLIMIT"},
	} {
		cfg, err := parseForTest(t, tc.env, "--root", testRoot(t))
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) || !strings.Contains(err.Error(), tc.env[tc.bad]) {
				t.Errorf("%v: err = %v, want one naming %s and its value", tc.env, err, tc.bad)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		if cfg.MemoryLimitRatio != tc.want {
			t.Errorf("%v: ratio = %v, want %v", tc.env, cfg.MemoryLimitRatio, tc.want)
		}
	}
}
