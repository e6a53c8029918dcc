package bootstrap

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// updateGolden rewrites testdata/*.golden.json: go test ./services/envoy/bootstrap -run Golden -update
var updateGolden = flag.Bool("update", false, "rewrite the golden bootstrap files in testdata")

const testdata = "testdata"

// testProxyConfig is Istio's default ProxyConfig for a sidecar plus a few mesh-wide settings.
func testProxyConfig() *meshv1alpha1.ProxyConfig {
	return &meshv1alpha1.ProxyConfig{
		ConfigPath:               "./etc/istio/proxy",
		BinaryPath:               "/usr/local/bin/envoy",
		ClusterName:              &meshv1alpha1.ProxyConfig_ServiceCluster{ServiceCluster: "istio-proxy"},
		DrainDuration:            durationpb.New(45e9),
		TerminationDrainDuration: durationpb.New(5e9),
		DiscoveryAddress:         "istiod.istio-system.svc:15012",
		ProxyAdminPort:           15000,
		StatusPort:               15020,
		ControlPlaneAuthPolicy:   meshv1alpha1.AuthenticationPolicy_MUTUAL_TLS,
		ProxyMetadata: map[string]string{
			"ISTIO_META_DNS_CAPTURE": "true",
			"ISTIO_META_MESH_ID":     "from-proxy-config", // the environment wins
			"NOT_META":               "ignored",
		},
		RuntimeValues: map[string]string{
			"envoy.reloadable_features.http_reject_path_with_fragment": "", // "" removes Istio's default
			"envoy.some_feature": "true",
		},
		ExtraStatTags: []string{"source_mesh_id", "destination_port"},
		ProxyStatsMatcher: &meshv1alpha1.ProxyConfig_ProxyStatsMatcher{
			InclusionSuffixes: []string{"upstream_cx_total"},
		},
		Concurrency: wrapperspb.Int32(2),
	}
}

// testConfig is a fixed pod environment; ConfigPath is a fresh directory.
func testConfig(t testing.TB) Config {
	return Config{
		ProxyType:      "sidecar",
		PodName:        "reviews-v2-5d4b9c8f7-x2x4z",
		PodNamespace:   "bookinfo",
		ServiceAccount: "bookinfo-reviews",
		InstanceIPs:    []string{"10.44.0.12", "10.44.0.12", "192.168.7.3"},
		IstioVersion:   "1.31.0",
		Proxy:          testProxyConfig(),
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin",
			"ISTIO_META_CLUSTER_ID=Kubernetes",
			"ISTIO_META_MESH_ID=cluster.local",
			"ISTIO_META_WORKLOAD_NAME=reviews-v2",
			"ISTIO_META_OWNER=kubernetes://apis/apps/v1/namespaces/bookinfo/deployments/reviews-v2",
			"ISTIO_META_INTERCEPTION_MODE=REDIRECT",
			`ISTIO_METAJSON_PLATFORM={"gcp_project":"demo"}`,
			"ISTIO_METAJSON_BROKEN=not json",
		},
		LabelsFile:          filepath.Join(testdata, "labels"),
		AnnotationsFile:     filepath.Join(testdata, "annotations"),
		ConfigPath:          filepath.Join(t.TempDir(), "etc/istio/proxy"),
		XDSSocket:           "./etc/istio/proxy/XDS",
		SDSSocket:           "./var/run/secrets/workload-spiffe-uds/socket",
		AdminPort:           15000,
		StatusPort:          15020,
		EnvoyStatusPort:     15021,
		EnvoyPrometheusPort: 15090,
		DeltaXDS:            true,
		DNSProxyAddr:        "localhost:15053",
	}
}

// writeStrict is Write of c, loaded by loadStrict.
func writeStrict(t *testing.T, c Config) *bootstrapv3.Bootstrap {
	t.Helper()
	out, err := Write(c)
	if err != nil {
		t.Fatal(err)
	}
	return loadStrict(t, out.Path)
}

// loadStrict parses a written bootstrap with no unknown fields allowed and validates it.
func loadStrict(t *testing.T, path string) *bootstrapv3.Bootstrap {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(data, b); err != nil {
		t.Fatalf("%s does not unmarshal into a Bootstrap: %v", path, err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("%s fails Envoy's validation: %v", path, err)
	}
	return b
}

func TestBootstrapGolden(t *testing.T) {
	c := testConfig(t)
	got, err := Write(c)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(c.ConfigPath, "envoy-rev.json"); got.Path != want || got.Custom || got.ConfigYAML != "" {
		t.Fatalf("Write = %+v, want Path %s, not custom, no override", got, want)
	}
	loadStrict(t, got.Path)
	data, err := os.ReadFile(got.Path)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join(testdata, "sidecar.golden.json")
	if *updateGolden {
		if err := os.WriteFile(golden, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(data, want) {
		t.Errorf("bootstrap differs from %s (run with -update after checking the change):\n%s", golden, testkit.LineDiff(string(want), string(data)))
	}
	// The directory is private to the agent.
	st, err := os.Stat(c.ConfigPath)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("config dir mode = %v, %v; want 0700", st.Mode().Perm(), err)
	}
}

func TestBootstrapIsDeterministic(t *testing.T) {
	c := testConfig(t)
	var first []byte
	for range 5 {
		b, err := Write(c)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(b.Path)
		if first == nil {
			first = data
		} else if !bytes.Equal(first, data) {
			t.Fatal("two writes of the same config differ")
		}
	}
	// No temp files are left behind by the atomic write.
	entries, _ := os.ReadDir(c.ConfigPath)
	if len(entries) != 1 {
		t.Errorf("config dir holds %d entries, want only envoy-rev.json", len(entries))
	}
}

func TestBootstrapContents(t *testing.T) {
	c := testConfig(t)
	b := writeStrict(t, c)
	n := b.GetNode()
	if n.GetId() != "sidecar~10.44.0.12~reviews-v2-5d4b9c8f7-x2x4z.bookinfo~bookinfo.svc.cluster.local" {
		t.Errorf("node id = %s", n.GetId())
	}
	if n.GetCluster() != "reviews.bookinfo" {
		t.Errorf("node cluster = %s, want reviews.bookinfo (app label)", n.GetCluster())
	}
	if l := n.GetLocality(); l.GetRegion() != "us-east1" || l.GetZone() != "us-east1-b" || l.GetSubZone() != "rack7" {
		t.Errorf("locality = %v", l)
	}
	md := n.GetMetadata().GetFields()
	str := func(k string) string { return md[k].GetStringValue() }
	for k, want := range map[string]string{
		"CLUSTER_ID": "Kubernetes", "MESH_ID": "cluster.local", "DNS_CAPTURE": "true",
		"WORKLOAD_NAME": "reviews-v2", "NAME": "reviews-v2-5d4b9c8f7-x2x4z", "NAMESPACE": "bookinfo",
		"SERVICE_ACCOUNT": "bookinfo-reviews", "INSTANCE_IPS": "10.44.0.12,192.168.7.3",
		"ISTIO_VERSION": "1.31.0", "gcp_project": "demo", "DNS_PROXY_ADDR": "localhost:15053",
	} {
		if got := str(k); got != want {
			t.Errorf("metadata %s = %q, want %q", k, got, want)
		}
	}
	// Istio always writes METADATA_DISCOVERY: PEER_METADATA_DISCOVERY, else ENABLE_HBONE.
	if got := str("METADATA_DISCOVERY"); got != "false" {
		t.Errorf("metadata METADATA_DISCOVERY = %q, want \"false\" (PEER_METADATA_DISCOVERY unset, no HBONE)", got)
	}
	for _, k := range []string{"NOT_META", "BROKEN", "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "credential", "STS_PORT"} {
		if _, ok := md[k]; ok {
			t.Errorf("metadata has %s", k)
		}
	}
	labels := md["LABELS"].GetStructValue().GetFields()
	if _, ok := labels["pod-template-hash"]; ok {
		t.Error("LABELS keeps pod-template-hash")
	}
	if labels["istio-locality"].GetStringValue() != "us-east1/us-east1-b/rack7" || labels["version"].GetStringValue() != "v2" {
		t.Errorf("LABELS = %v", labels)
	}
	if md["ANNOTATIONS"].GetStructValue().GetFields()["kubernetes.io/config.seen"] == nil {
		t.Error("ANNOTATIONS lacks the file's annotations")
	}
	if san := md["PILOT_SAN"].GetListValue().GetValues(); len(san) != 1 || san[0].GetStringValue() != "istiod.istio-system.svc" {
		t.Errorf("PILOT_SAN = %v", san)
	}
	if md["ENVOY_STATUS_PORT"].GetNumberValue() != 15021 || md["ENVOY_PROMETHEUS_PORT"].GetNumberValue() != 15090 {
		t.Error("ENVOY_STATUS_PORT / ENVOY_PROMETHEUS_PORT missing")
	}
	pc := md["PROXY_CONFIG"].GetStructValue().GetFields()
	if pc["discoveryAddress"].GetStringValue() != "istiod.istio-system.svc:15012" || pc["drainDuration"].GetStringValue() != "45s" {
		t.Errorf("PROXY_CONFIG = %v", pc)
	}

	if a := b.GetAdmin().GetAddress().GetSocketAddress(); a.GetAddress() != "127.0.0.1" || a.GetPortValue() != 15000 {
		t.Errorf("admin address = %v", a)
	}
	ads := b.GetDynamicResources().GetAdsConfig()
	if ads.GetApiType().String() != "DELTA_GRPC" || !ads.GetSetNodeOnFirstMessageOnly() || ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName() != "xds-grpc" {
		t.Errorf("ads config = %v", ads)
	}
	if b.GetDynamicResources().GetLdsConfig().GetInitialFetchTimeout().AsDuration() != 0 {
		t.Error("lds initial_fetch_timeout is not 0s")
	}
	clusters := map[string]string{}
	for _, cl := range b.GetStaticResources().GetClusters() {
		ep := cl.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress()
		if p := ep.GetPipe(); p != nil {
			clusters[cl.GetName()] = "pipe:" + p.GetPath()
		} else {
			clusters[cl.GetName()] = ep.GetSocketAddress().GetAddress() + ":" + strconv.Itoa(int(ep.GetSocketAddress().GetPortValue()))
		}
	}
	for name, want := range map[string]string{
		"prometheus_stats": "127.0.0.1:15000", "agent": "127.0.0.1:15020",
		"sds-grpc": "pipe:./var/run/secrets/workload-spiffe-uds/socket", "xds-grpc": "pipe:./etc/istio/proxy/XDS",
	} {
		if clusters[name] != want {
			t.Errorf("cluster %s -> %q, want %q", name, clusters[name], want)
		}
	}
	var listeners []string
	for _, l := range b.GetStaticResources().GetListeners() {
		listeners = append(listeners, l.GetName())
		if !l.GetIgnoreGlobalConnLimit() || !l.GetBypassOverloadManager() {
			t.Errorf("listener %s is subject to the global connection limit", l.GetName())
		}
	}
	if strings.Join(listeners, ",") != "0.0.0.0_15090,0.0.0.0_15021" {
		t.Errorf("listeners = %v", listeners)
	}
	// Runtime: the "" value removed Istio's default, "true" became a boolean.
	rt := b.GetLayeredRuntime().GetLayers()[0].GetStaticLayer().GetFields()
	if _, ok := rt["envoy.reloadable_features.http_reject_path_with_fragment"]; ok {
		t.Error("runtime value \"\" did not remove the default flag")
	}
	if !rt["envoy.some_feature"].GetBoolValue() || rt["re2.max_program_size.error_level"].GetStringValue() != "32768" {
		t.Errorf("runtime flags = %v", rt)
	}
	// Stats: {pod_ip} expanded per IP, extra tags from ProxyConfig and annotation without duplicates.
	js, _ := protojson.Marshal(b.GetStatsConfig())
	for _, want := range []string{`"http.10.44.0.12_"`, `"http.192.168.7.3_"`, `"upstream_proxy_version"`, `"upstream_cx_total"`, `"cluster_manager"`} {
		if !bytes.Contains(js, []byte(want)) {
			t.Errorf("stats_config lacks %s", want)
		}
	}
	if bytes.Count(js, []byte(`"tagName":"source_mesh_id"`)) != 1 {
		t.Error("extra stat tag source_mesh_id not exactly once")
	}
	if len(b.GetStatsConfig().GetHistogramBucketSettings()) != 2 {
		t.Error("histogram buckets from the annotation missing")
	}
	if b.GetTracing() != nil {
		t.Error("tracing set without a tracer")
	}
}

func TestBootstrapIPFamilies(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ips       []string
		dualStack bool
		admin     string
		listener  string
		extra     string
	}{
		{"ipv4", []string{"10.0.0.1"}, false, "127.0.0.1", "0.0.0.0_15021", ""},
		{"ipv6", []string{"fd00::1", "fd00::2"}, false, "::1", "::_15021", ""},
		{"mixed without dual stack", []string{"fd00::1", "10.0.0.1"}, false, "127.0.0.1", "0.0.0.0_15021", ""},
		{"dual stack v6 first", []string{"fd00::1", "10.0.0.1"}, true, "::1", "::_15021", "0.0.0.0"},
		{"dual stack v4 first", []string{"10.0.0.1", "fd00::1"}, true, "127.0.0.1", "0.0.0.0_15021", "::"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t)
			c.InstanceIPs, c.DualStack = tc.ips, tc.dualStack
			b := writeStrict(t, c)
			if got := b.GetAdmin().GetAddress().GetSocketAddress().GetAddress(); got != tc.admin {
				t.Errorf("admin = %s, want %s", got, tc.admin)
			}
			l := b.GetStaticResources().GetListeners()[1]
			if l.GetName() != tc.listener {
				t.Errorf("listener = %s, want %s", l.GetName(), tc.listener)
			}
			var extra string
			if a := l.GetAdditionalAddresses(); len(a) > 0 {
				extra = a[0].GetAddress().GetSocketAddress().GetAddress()
			}
			if extra != tc.extra {
				t.Errorf("additional address = %q, want %q", extra, tc.extra)
			}
		})
	}
}

func TestBootstrapOptions(t *testing.T) {
	c := testConfig(t)
	c.DeltaXDS = false
	c.LogAsJSON = true
	c.MetricsLocalhostOnly = true
	c.ExitOnZeroActiveConnections = true
	c.CredentialSocketExists = true
	peerMetadataDiscovery := true
	c.MetadataDiscovery = &peerMetadataDiscovery
	c.STSPort = 15463
	c.OutlierLogPath = "/dev/stdout"
	c.Proxy.StatsCompression = wrapperspb.Bool(false)
	c.Proxy.Tracing = &meshv1alpha1.Tracing{Tracer: &meshv1alpha1.Tracing_Zipkin_{Zipkin: &meshv1alpha1.Tracing_Zipkin{Address: "zipkin.istio-system:9411"}}}
	c.Proxy.RuntimeValues = map[string]string{"overload.global_downstream_max_connections": "5000"}
	b := writeStrict(t, c)
	if b.GetDynamicResources().GetAdsConfig().GetApiType().String() != "GRPC" {
		t.Error("ISTIO_DELTA_XDS=false did not select GRPC")
	}
	if b.GetApplicationLogConfig().GetLogFormat().GetJsonFormat() == nil {
		t.Error("log_as_json did not select the JSON application log format")
	}
	if b.GetStaticResources().GetListeners()[0].GetName() != "127.0.0.1_15090" {
		t.Errorf("METRICS_LOCALHOST_ACCESS_ONLY: listener %s", b.GetStaticResources().GetListeners()[0].GetName())
	}
	if n := len(b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()); n != 1 {
		t.Errorf("metrics listener has %d network filters", n)
	}
	md := b.GetNode().GetMetadata().GetFields()
	for k, want := range map[string]string{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS": "true", "credential": "true", "METADATA_DISCOVERY": "true", "STS_PORT": "15463", "OUTLIER_LOG_PATH": "/dev/stdout"} {
		if got := md[k].GetStringValue(); got != want {
			t.Errorf("metadata %s = %q, want %q", k, got, want)
		}
	}
	for _, ext := range b.GetBootstrapExtensions() {
		if ext.GetName() == "metadata_discovery" {
			t.Error("metadata_discovery extension over state-of-the-world xDS (Istio disables it there)")
		}
	}
	if b.GetClusterManager().GetOutlierDetection().GetEventLogPath() != "/dev/stdout" {
		t.Error("outlier log path not in cluster_manager")
	}
	js, _ := protojson.Marshal(b.GetStatsConfig())
	if !bytes.Contains(js, []byte(`"downstream_cx_active"`)) {
		t.Error("EXIT_ON_ZERO_ACTIVE_CONNECTIONS did not keep downstream_cx_active")
	}
	if b.GetTracing().GetHttp().GetName() != "envoy.tracers.zipkin" {
		t.Error("zipkin tracer missing")
	}
	last := b.GetStaticResources().GetClusters()[len(b.GetStaticResources().GetClusters())-1]
	if last.GetName() != "zipkin" || last.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue() != 9411 {
		t.Errorf("zipkin cluster = %v", last)
	}
	mon, _ := protojson.Marshal(b.GetOverloadManager())
	if !bytes.Contains(mon, []byte(`"5000"`)) {
		t.Errorf("overload manager limit = %s, want 5000 from runtimeValues", mon)
	}

	c.Proxy.Tracing = &meshv1alpha1.Tracing{Tracer: &meshv1alpha1.Tracing_Zipkin_{Zipkin: &meshv1alpha1.Tracing_Zipkin{Address: "zipkin-no-port"}}}
	if _, err := Write(c); err == nil || !strings.Contains(err.Error(), "zipkin.address") {
		t.Errorf("bad zipkin address: err = %v", err)
	}
}

// PEER_METADATA_DISCOVERY (Istio's name) turns the metadata_discovery extension on over delta xDS;
// unset, ISTIO_META_ENABLE_HBONE decides; set to false, it wins over HBONE.
func TestPeerMetadataDiscovery(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		name      string
		set       *bool
		hbone     bool
		wantMeta  string
		wantExtra bool
	}{
		{"unset", nil, false, "false", false},
		{"set", &yes, false, "true", true},
		{"unset with HBONE", nil, true, "true", true},
		{"false beats HBONE", &no, true, "false", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t)
			c.MetadataDiscovery = tc.set
			if tc.hbone {
				c.Env = append(c.Env, "ISTIO_META_ENABLE_HBONE=true")
			}
			b := writeStrict(t, c)
			if got := b.GetNode().GetMetadata().GetFields()["METADATA_DISCOVERY"].GetStringValue(); got != tc.wantMeta {
				t.Errorf("METADATA_DISCOVERY = %q, want %q", got, tc.wantMeta)
			}
			has := len(b.GetBootstrapExtensions()) > 0 && b.GetBootstrapExtensions()[0].GetName() == "metadata_discovery"
			if has != tc.wantExtra {
				t.Errorf("metadata_discovery extension: %v, want %v", has, tc.wantExtra)
			}
		})
	}
}

func TestWaypointUsesDeltaAndMetadataDiscovery(t *testing.T) {
	c := testConfig(t)
	c.ProxyType, c.DeltaXDS = "waypoint", false
	b := writeStrict(t, c)
	if b.GetDynamicResources().GetAdsConfig().GetApiType().String() != "DELTA_GRPC" {
		t.Error("waypoint is not always delta")
	}
	if b.GetBootstrapExtensions()[0].GetName() != "metadata_discovery" {
		t.Error("waypoint lacks metadata_discovery")
	}
	if !strings.HasPrefix(b.GetNode().GetId(), "waypoint~") {
		t.Errorf("node id = %s", b.GetNode().GetId())
	}
}

func TestValidate(t *testing.T) {
	good := testConfig(t)
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"proxy type", func(c *Config) { c.ProxyType = "gateway" }, `ProxyType "gateway"`},
		{"no IPs", func(c *Config) { c.InstanceIPs = nil }, "InstanceIPs is empty"},
		{"bad IP", func(c *Config) { c.InstanceIPs = []string{"10.0.0.300"} }, `"10.0.0.300" is not an IP`},
		{"no proxy config", func(c *Config) { c.Proxy = nil }, "Proxy (ProxyConfig) is nil"},
		{"no config path", func(c *Config) { c.ConfigPath = "" }, "ConfigPath is empty"},
		{"admin port", func(c *Config) { c.AdminPort = 0 }, "AdminPort 0"},
		{"status port", func(c *Config) { c.EnvoyStatusPort = 70000 }, "EnvoyStatusPort 70000"},
		{"no xds socket", func(c *Config) { c.XDSSocket = "" }, "XDSSocket is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t)
			tc.edit(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig naming %q", err, tc.want)
			}
			if _, werr := Write(c); werr == nil {
				t.Fatal("Write accepted an invalid config")
			}
		})
	}
}

// MESHAGENT_ENVOY_ANSWERS_READINESS (#36): the :15021 listener answers /healthz/ready in Envoy
// while the agent's runtime key is 100 (default 0), before Istio's route to the agent; a user
// template's listener is the user's, and the agent does not set the key for it.
func TestReadinessRouteInEnvoy(t *testing.T) {
	routesOf := func(c Config) []*routev3.Route {
		t.Helper()
		for _, l := range writeStrict(t, c).GetStaticResources().GetListeners() {
			if l.GetAddress().GetSocketAddress().GetPortValue() != uint32(c.EnvoyStatusPort) {
				continue
			}
			hcm := &hcmv3.HttpConnectionManager{}
			if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
				t.Fatal(err)
			}
			return hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()
		}
		t.Fatal("no listener on the Envoy status port")
		return nil
	}
	c := testConfig(t)
	c.EnvoyAnswersReadiness = true
	if !c.ReadinessInEnvoy() {
		t.Fatal("ReadinessInEnvoy false for the agent's own bootstrap")
	}
	routes := routesOf(c)
	if len(routes) != 2 {
		t.Fatalf("%d routes, want Envoy's answer and Istio's route to the agent", len(routes))
	}
	first := routes[0]
	frac := first.GetMatch().GetRuntimeFraction()
	if first.GetMatch().GetPrefix() != "/healthz/ready" || frac.GetRuntimeKey() != ReadinessKey || frac.GetDefaultValue().GetNumerator() != 0 ||
		first.GetDirectResponse().GetStatus() != 200 {
		t.Errorf("first route = %v, want /healthz/ready answered 200 while %s (default 0)", first, ReadinessKey)
	}
	if routes[1].GetRoute().GetCluster() != agentCluster {
		t.Errorf("second route = %v, want Istio's route to the agent", routes[1])
	}

	c.EnvoyAnswersReadiness = false
	if routes := routesOf(c); len(routes) != 1 || routes[0].GetRoute().GetCluster() != agentCluster {
		t.Errorf("off: routes = %v, want Istio's route alone", routes)
	}
	c.EnvoyAnswersReadiness = true
	c.TemplateFile = "/etc/istio/custom-bootstrap/envoy.json.tmpl"
	if c.ReadinessInEnvoy() {
		t.Error("ReadinessInEnvoy true for a user template, whose listener does not read the key")
	}
}
