package config

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/meshagent/meshagent/messages/compliance"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// effective is one variable's value as the agent uses it, formatted as
// help formats its default.
type effective struct{ name, used string }

func eff[T any](s *envVar[T], used T) effective { return effective{s.Name, s.kind.format(used)} }

// helpDefaults is the DEFAULT column of `meshagent help env`, by variable.
func helpDefaults(t *testing.T) map[string]string {
	t.Helper()
	var b strings.Builder
	if err := WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	from, to := strings.Index(lines[0], "DEFAULT"), strings.Index(lines[0], "SERVICE")
	out := map[string]string{}
	for _, line := range lines[1:] {
		out[strings.Fields(line)[0]] = strings.TrimSpace(line[from:to])
	}
	return out
}

// With no variable set, every value the agent uses is the default `help
// env` prints (#34: the table was documentation, and the defaults lived at
// the read sites, so help could print one the agent did not use). Each
// entry is checked where it takes effect: the plan of a proxy start, the
// flags, a VM's environment; an entry whose effect is not a value of
// those is listed in notInPlan, with why.
func TestDefaultsAreWhatHelpPrints(t *testing.T) {
	root := testRoot(t)
	plan, err := parseForTest(t, nil, "--root", root)
	if err != nil {
		t.Fatal(err)
	}
	withDNS, err := parseForTest(t, nil, "--root", testRoot(t), "--name-table", "names.json") // the DNS proxy on, with no variable
	if err != nil {
		t.Fatal(err)
	}
	tc, e, b, c, sds, x, dns, st := plan.Tree, plan.Tree.Envoy, plan.Tree.Envoy.Bootstrap, plan.Tree.Certs, plan.Tree.SDS, plan.Tree.XDS, withDNS.Tree.DNS, plan.Tree.Status
	rules := tc.Capture.Rules
	rel := func(path string) string { r, _ := filepath.Rel(root, path); return "./" + r }

	f, s := &ProxyFlags{}, NewSettings(pflag.NewFlagSet("proxy", pflag.ContinueOnError))
	BindProxyFlags(s, f)
	sf := &StandaloneFlags{}
	BindStandaloneFlags(s, sf)
	vf := &VMFlags{}
	BindVMFlags(s, vf)
	if err := s.Resolve(MapEnvironment(nil)); err != nil {
		t.Fatal(err)
	}
	vmRoot := t.TempDir()
	writeRootFile(t, vmRoot, vf.clusterEnv, "")
	vm, err := ReadVM(vmRoot, vf, Host{Env: MapEnvironment(nil)}, &Problems{})
	if err != nil {
		t.Fatal(err)
	}
	vmVar := func(name string) string { v, _ := vm.Env.source().Get(name); return v }
	vmProxyConfig := func(field string) string {
		_, after, _ := strings.Cut(vmVar("PROXY_CONFIG"), field+": ")
		v, _, _ := strings.Cut(after, "\n")
		return v
	}

	checks := []effective{
		eff(envPodName, b.PodName),
		eff(envPodNamespace, b.PodNamespace),
		eff(envServiceAccount, b.ServiceAccount),
		eff(envInstanceIP, st.Probes.Host),
		eff(envIstioCPULimit, int(plan.Proxy.GetConcurrency().GetValue())),

		eff(envEnvoyStatusPort, b.EnvoyStatusPort),
		eff(envEnvoyPrometheusPort, b.EnvoyPrometheusPort),
		eff(envEnvoySecureMetricsPort, b.SecureMetricsPort),
		eff(envEnvoySecureMergedMetricsPort, b.SecureMergedMetricsPort),
		eff(envEnvoyStatusPortEnableProxyProtocol, b.StatusPortProxyProtocol),
		eff(envIstioBootstrap, b.IstioBootstrap),
		eff(envIstioBootstrapOverride, b.OverrideFile),
		eff(envHostIP, b.HostIP),
		eff(envIstioDeltaXDS, b.DeltaXDS),
		eff(envIstioDualStack, b.DualStack),
		eff(envExitOnZeroActiveConnections, e.ExitOnZeroActiveConnections),
		eff(envMinimumDrainDuration, e.MinimumDrainDuration),
		eff(envEnvoySkipDeprecatedLogs, e.Args.SkipDeprecatedLogs),
		eff(envIstioEnvoyEnableCoreDump, e.Args.EnableCoreDump),
		eff(envDisableEnvoy, tc.Envoy == nil),
		eff(envCompliancePolicy, compliance.Policy(b.CompliancePolicy)),
		eff(envHTTPStripFragmentFromPathUnsafeIfDisabled, !b.KeepPathFragment),
		eff(envGCPZone, b.Platform.Zone),

		eff(envIstiodSAN, c.CAServerName),
		eff(envProvCert, c.ProvCertDir),
		eff(envOutputCerts, c.OutputCertsDir),
		eff(envFileDebounceDuration, c.FileDebounce),
		eff(envIstioMetaClusterID, c.ClusterID),
		eff(envIstioMetaCertSigner, c.CertSigner),
		eff(envTrustDomain, c.TrustDomain),
		eff(envSecretTTL, c.SecretTTL),
		eff(envSecretGracePeriodRatio, c.GraceRatio),
		eff(envSecretGracePeriodRatioJitter, c.GraceJitter),
		eff(envWorkloadRSAKeySize, c.RSAKeySize),
		eff(envECCSignatureAlgorithm, string(c.KeyAlgorithm)),
		eff(envECCCurve, c.ECCCurve),
		eff(envPKCS8Key, c.PKCS8Key),
		eff(envWorkloadIdentitySocketFile, sds.WorkloadIdentitySocketFile),
		eff(envPilotEnableCACRL, sds.CRLFile != ""),

		eff(envGRPCKeepaliveInterval, x.KeepaliveInterval),
		eff(envGRPCKeepaliveTimeout, x.KeepaliveTimeout),
		eff(envProxyConfigXDSAgent, x.ProxyConfigXDS),
		eff(envXDSOfflineCache, x.OfflineCache),
		eff(envGRPCXDSBootstrap, rel(x.GRPCBootstrap.Path)),
		eff(envWasmRemoteLoadConversion, x.Wasm.Dir != ""),
		eff(envWasmInsecureRegistries, strings.Join(x.Wasm.InsecureRegistries, ",")),
		eff(envWasmModuleExpiry, x.Wasm.ModuleExpiry),
		eff(envWasmPurgeInterval, x.Wasm.PurgeInterval),
		eff(envWasmHTTPRequestTimeout, x.Wasm.HTTPRequestTimeout),
		eff(envWasmHTTPRequestRetries, x.Wasm.HTTPRequestMaxRetries),
		eff(envWasmMaxBinarySize, int(x.Wasm.MaxModuleBytes)),

		eff(envIstioMetaDNSCapture, tc.DNS != nil),
		eff(envIstioMetaEnableDNSServer, tc.DNS != nil),
		eff(envDNSProxyAddr, dns.Listen),
		eff(envDNSForwardTimeout, dns.ForwardTimeout),
		eff(envDNSForwardParallel, dns.ForwardParallel),

		eff(envRewriteProbeLegacyLocalhostDestination, st.Probes.Host == "localhost"),
		eff(envIstioEnableHTTP2Probing, !st.Probes.DisableHTTP2),
		eff(envEnableProbeKeepaliveConnections, st.Probes.KeepAlive),
		eff(envPilotAgentMergeEnvoyStats, st.Metrics.EnvoyPort != 0),
		eff(envMetricsLocalhostAccessOnly, st.Metrics.LocalhostOnly),

		eff(envInboundCapturePort, rules.InboundCapturePort),
		eff(envInboundTunnelPort, rules.InboundTunnelPort),
		eff(envIstioInboundTProxyMark, rules.InboundTProxyMark),
		eff(envIstioInboundTProxyRouteTable, rules.InboundTProxyRouteTable),
		eff(envIstioInboundPorts, rules.InboundPortsInclude),
		eff(envIstioLocalExcludePorts, rules.InboundPortsExclude),
		eff(envIstioExcludeInterfaces, rules.ExcludeInterfaces),
		eff(envIstioServiceCIDR, rules.OutboundIPRangesInclude),
		eff(envIstioServiceExcludeCIDR, rules.OutboundIPRangesExclude),
		eff(envIstioOutboundPorts, rules.OutboundPortsInclude),
		eff(envIstioLocalOutboundPortsExclude, rules.OutboundPortsExclude),
		eff(envKubeVirtInterfaces, rules.RerouteVirtualInterfaces),
		eff(envDryRun, rules.DryRun),
		eff(envIptablesProbePort, int(rules.IptablesProbePort)),
		eff(envProbeTimeout, rules.ProbeTimeout),
		eff(envSkipRuleApply, rules.SkipRuleApply),
		eff(envRunValidation, rules.RunValidation),
		eff(envInvalidDrop, rules.DropInvalid),
		eff(envCaptureAllDNS, rules.CaptureAllDNS),
		eff(envNetworkNamespace, rules.NetworkNamespace),
		eff(envCNIMode, rules.CNIMode),
		eff(envReconcile, rules.Reconcile),
		eff(envCleanupOnly, rules.CleanupOnly),
		eff(envForceApply, rules.ForceApply),
		eff(envNativeNftables, rules.NativeNftables),
		eff(envForceIptablesBinary, rules.ForceIptablesBinary),
		eff(envIstioOutboundOwnerGroups, rules.OwnerGroupsInclude),
		eff(envIstioOutboundOwnerGroupsExclude, rules.OwnerGroupsExclude),
		eff(envIstioOutboundIPv4LoopbackCIDR, rules.HostIPv4LoopbackCidr),

		eff(envMeshagentRoot, f.Root),
		eff(envMeshagentCapture, f.Capture),
		eff(envMeshagentCaptureCheckInterval, tc.Capture.CheckInterval),
		eff(envMeshagentHotRestart, e.HotRestart != nil),
		eff(envMeshagentEnvoyAnswersReadiness, e.Bootstrap.EnvoyAnswersReadiness),
		eff(envMeshagentChaos, st.Chaos),
		eff(envMeshagentMesh, sf.mesh),
		eff(envMeshagentCertLifetime, sf.certLifetime),
		eff(envMeshagentControlplaneListen, sf.controlPlaneListen),
		eff(envMeshagentCAListen, sf.caListen),

		eff(envIstioClusterConfig, vf.clusterEnv),
		eff(envIstioSidecarConfig, vf.sidecarEnv),
		eff(envIstioCustomIPTables, vm.CustomIPTables),
		eff(envIstioNamespace, vmVar("POD_NAMESPACE")),
		eff(envIstioSystemNamespace, strings.TrimSuffix(strings.TrimPrefix(vmVar("CA_ADDR"), "istiod."), ".svc:15012")),
		eff(envIstioService, vmProxyConfig("serviceCluster")),
		eff(envIstioCPAuth, vmProxyConfig("controlPlaneAuthPolicy")),

		eff(envGOGC, *plan.GCPercent),
		eff(envIdleGOMAXPROCS, plan.IdleMaxProcs),
		eff(envAUTOMEMLIMIT, plan.MemoryLimitRatio),
	}
	// Entries whose unset value is not a value of the plan: a choice among
	// others, a layer, or a variable only others read.
	notInPlan := map[string]string{
		"PROXY_CONFIG":                 "a ProxyConfig layer: none",
		"CLOUD_PLATFORM":               "with GCP_METADATA, the platform's metadata: none",
		"GCP_METADATA":                 "the platform's metadata: none",
		"GCP_QUOTA_PROJECT":            "in the platform's metadata: none",
		"PILOT_CERT_PROVIDER":          "a choice of source: TestCertProvider",
		"FILE_MOUNTED_CERTS":           "a choice of source (files only)",
		"KUBERNETES_SERVICE_HOST":      "only whether it is set",
		"XDS_ROOT_CA":                  "a choice of roots: TestXDSRoots",
		"ISTIO_KUBE_APP_PROBERS":       "the application's probes: none",
		"ISTIO_PROMETHEUS_ANNOTATIONS": "the application's metrics: none",
		"ENVOY_USER":                   "a user name, looked up for --proxy-uid's default",
		"ISTIO_SVC_IP":                 "the VM's INSTANCE_IP: none",
		"PILOT_ADDRESS":                "istiod's address on a VM: none",
		"ISTIO_PILOT_PORT":             "istiod's port on a VM: none",
		"GODEBUG":                      "read by Go's runtime; its default is the binary's //go:debug (TestUpdateMaxProcsOff)",
		"GOMEMLIMIT":                   "read by Go's runtime; set, no AUTOMEMLIMIT",
		"NOTIFY_SOCKET":                "read by go-systemd",
		"WATCHDOG_USEC":                "read by go-systemd",
	}
	help := helpDefaults(t)
	checked := map[string]bool{}
	for _, ch := range checks {
		checked[ch.name] = true
		if ch.used != help[ch.name] {
			t.Errorf("%s: the agent uses %s, help env prints %q", ch.name, ch.used, help[ch.name])
		}
	}
	for _, v := range Vars() {
		if !v.Prefix && !v.derived && !checked[v.Name] && notInPlan[v.Name] == "" {
			t.Errorf("%s: its default is not checked against help (add it to checks, or to notInPlan with why)", v.Name)
		}
	}
}

// A variable is read through its entry, never by name: no source of the
// commands looks a variable up by a literal name outside environment.go
// (which reads the entries).
func TestVariablesReadOnlyThroughTheTable(t *testing.T) {
	byName := regexp.MustCompile(`(Getenv|LookupEnv|\.Get|\.Lookup)\("[A-Z][A-Z0-9_]+"\)`)
	var files []string
	for _, pattern := range []string{"*.go", "../*.go"} {
		matched, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, matched...)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "environment.go" {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range byName.FindAllString(string(src), -1) {
			t.Errorf("%s: %s reads a variable by name, not through its entry in env.go", f, m)
		}
	}
}

// docs/reference.md's environment section and Env name the same
// variables: every variable the docs name is in the table, and every
// variable of the table is named in the docs (#26: 62 were not).
func TestEnvTableMatchesReference(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "### Environment variables")
	if !ok {
		t.Fatal("docs/reference.md has no environment section")
	}
	section, _, _ = strings.Cut(section, "\n### ")
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`([A-Z][A-Z0-9_]+)(\\*|\\[_EXCLUDE\\])?`").FindAllStringSubmatch(section, -1) {
		if m[1] == "UPPER_SNAKE" || m[1] == "METADATA_DISCOVERY" { // a naming rule; a metadata key
			continue
		}
		named[m[1]] = true
		if m[2] == "[_EXCLUDE]" {
			named[m[1]+"_EXCLUDE"] = true
		}
		if _, ok := find(m[1]); !ok {
			t.Errorf("docs/reference.md names %s, not in Env", m[1])
		}
	}
	// The proxy's and standalone's flag tables name their variables too.
	for _, m := range regexp.MustCompile("\\| `--[a-z-]+` \\| `([A-Z][A-Z0-9_]+)`").FindAllStringSubmatch(string(doc), -1) {
		named[m[1]] = true
	}
	var missing []string
	for _, v := range Vars() {
		if !named[v.Name] {
			missing = append(missing, v.Name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("in Env but not named in docs/reference.md (%d): %s", len(missing), strings.Join(missing, " "))
	}
}

// A bad value of a variable two configs read (Envoy's and istio-iptables'
// --dual-stack alias) is one line of the start's errors, not two.
func TestBadSharedVariableReportedOnce(t *testing.T) {
	_, err := parseForTest(t, map[string]string{"ISTIO_DUAL_STACK": "maybe"}, "--root", testRoot(t))
	if err == nil {
		t.Fatal("ISTIO_DUAL_STACK=maybe accepted")
	}
	if n := strings.Count(err.Error(), `ISTIO_DUAL_STACK="maybe"`); n != 1 {
		t.Errorf("ISTIO_DUAL_STACK's bad value reported %d times:\n%v", n, err)
	}
}

// A bad address names its variable, never a field of a service's config
// (#32: DNS_PROXY_ADDR=0.0.0.0:15053 gave "dns: dns: Listen ...").
func TestBadAddressesNameTheirVariable(t *testing.T) {
	_, err := parseForTest(t, map[string]string{"DNS_PROXY_ADDR": "localhost", "CA_ADDR": "nohost", "ISTIO_META_DNS_CAPTURE": "true"}, "--root", testRoot(t))
	if err == nil {
		t.Fatal("bad addresses accepted")
	}
	for _, want := range []string{`DNS_PROXY_ADDR="localhost": want host:port`, `CA_ADDR="nohost": want host:port`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "Listen") || strings.Contains(err.Error(), "CAAddr") {
		t.Errorf("error names a config field:\n%v", err)
	}
}

// An absolute --meshConfig is under --root like every agent path; a
// missing one says so, naming both paths (#32: it was re-rooted silently).
func TestAbsoluteMeshConfigIsUnderRoot(t *testing.T) {
	root := testRoot(t)
	_, err := parseForTest(t, nil, "--root", root, "--meshConfig", "/etc/mesh.yaml")
	if err == nil {
		t.Fatal("a missing --meshConfig accepted")
	}
	for _, want := range []string{`--meshConfig "/etc/mesh.yaml"`, filepath.Join(root, "etc/mesh.yaml"), "under --root"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// The test kit's reading of the table (testkit.TableDefault, for the
// services' tests, which cannot import this package) finds every constant
// default as the table holds it.
func TestTestKitReadsTheTable(t *testing.T) {
	for _, e := range table {
		switch s := e.(type) {
		case *envVar[string]:
			testKitReads(t, s)
		case *envVar[bool]:
			testKitReads(t, s)
		case *envVar[int]:
			testKitReads(t, s)
		case *envVar[float64]:
			testKitReads(t, s)
		case *envVar[time.Duration]:
			testKitReads(t, s)
		case *envVar[compliance.Policy]:
			if got := testkit.TableDefault[string](t, s.Name); got != string(s.Default) {
				t.Errorf("%s: the test kit reads %v, the table holds %v", s.Name, got, s.Default)
			}
		case *envPrefix:
		default:
			t.Errorf("%T: a kind of entry the test kit is not checked on", e)
		}
	}
}

func testKitReads[T string | bool | int | float64 | time.Duration](t *testing.T, s *envVar[T]) {
	t.Helper()
	if got := testkit.TableDefault[T](t, s.Name); got != s.Default {
		t.Errorf("%s: the test kit reads %v, the table holds %v", s.Name, got, s.Default)
	}
}

// GRPC_KEEPALIVE_INTERVAL=0s is Istio's 0: handed to gRPC as given (its
// floor, 10s, upstream), not the table's 30s (#34: the proxy's fallback
// turned it into 30s without a word). A negative one has no meaning in
// Istio either (gRPC would clamp it) and is refused, naming the variable.
func TestKeepaliveZeroIsIstios(t *testing.T) {
	plan, err := parseForTest(t, map[string]string{"GRPC_KEEPALIVE_INTERVAL": "0s", "GRPC_KEEPALIVE_TIMEOUT": "0s"}, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if x := plan.Tree.XDS; x.KeepaliveInterval != 0 || x.KeepaliveTimeout != 0 {
		t.Errorf("keepalive %v/%v, want 0/0 as set", x.KeepaliveInterval, x.KeepaliveTimeout)
	}
	if err := plan.Tree.XDS.Validate(); err != nil {
		t.Errorf("the XDS proxy refuses Istio's 0: %v", err)
	}
	for _, name := range []string{"GRPC_KEEPALIVE_INTERVAL", "GRPC_KEEPALIVE_TIMEOUT"} {
		_, err := parseForTest(t, map[string]string{name: "-1s"}, "--root", testRoot(t))
		if err == nil || !strings.Contains(err.Error(), name+`="-1s"`) {
			t.Errorf("%s=-1s: %v, want an error naming it", name, err)
		}
	}
}

// WASM_PURGE_INTERVAL=0 and WASM_MODULE_EXPIRY=0 are Istio's default
// (pkg/wasm/cache.go), the table's.
func TestWasmZeroIsIstiosDefault(t *testing.T) {
	plan, err := parseForTest(t, map[string]string{"WASM_PURGE_INTERVAL": "0s", "WASM_MODULE_EXPIRY": "0s"}, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if w := plan.Tree.XDS.Wasm; w.PurgeInterval != envWasmPurgeInterval.Default || w.ModuleExpiry != envWasmModuleExpiry.Default {
		t.Errorf("purge %v, expiry %v, want the table's %v, %v", w.PurgeInterval, w.ModuleExpiry, envWasmPurgeInterval.Default, envWasmModuleExpiry.Default)
	}
}

// A setting whose 0 its service cannot honour is refused at start,
// naming its variable, not replaced by a default (#34).
func TestZeroRefused(t *testing.T) {
	for name, value := range map[string]string{"WASM_HTTP_REQUEST_TIMEOUT": "0s", "WASM_HTTP_REQUEST_MAX_RETRIES": "0",
		"ISTIO_WASM_MAX_BINARY_SIZE_BYTES": "0", "MESHAGENT_CAPTURE_CHECK_INTERVAL": "0s"} {
		_, err := parseForTest(t, map[string]string{name: value}, "--root", testRoot(t))
		if err == nil || !strings.Contains(err.Error(), name+"="+strconv.Quote(value)+": want more than 0") {
			t.Errorf("%s=%s: %v, want an error naming it", name, value, err)
		}
	}
}

// A service's Config field tagged with its variable (`env:"SECRET_TTL"`,
// what testkit.FillFromTable fills for tests) holds that variable's
// default in the plan of a start with no variable set: the tag names
// the variable the field really takes.
func TestTaggedFieldsTakeTheirVariable(t *testing.T) {
	plan, err := parseForTest(t, nil, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	tc := plan.Tree
	tagged := 0
	for _, cfg := range []any{tc.Certs, tc.SDS, tc.XDS, &tc.XDS.Wasm, tc.Capture, &tc.Capture.Rules} {
		got := reflect.ValueOf(cfg).Elem()
		want := reflect.New(got.Type())
		testkit.FillFromTable(t, want.Interface())
		for i := range got.NumField() {
			f := got.Type().Field(i)
			name, ok := f.Tag.Lookup("env")
			if !ok {
				continue
			}
			tagged++
			if _, ok := find(name); !ok {
				t.Errorf("%s.%s: env %s is not in the table", got.Type(), f.Name, name)
			}
			if g, w := got.Field(i).Interface(), want.Elem().Field(i).Interface(); g != w {
				t.Errorf("%s.%s (env %s): the plan has %v, the table's default is %v", got.Type(), f.Name, name, g, w)
			}
		}
	}
	if tagged == 0 {
		t.Fatal("no tagged field found")
	}
}
