package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/spf13/pflag"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/messages/compliance"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// Istio's pilot-agent tolerates unknown flags on the root command and on
// proxy (FParseErrWhitelist); meshagent does too, and names them in a
// warning. (The agent running with one is TestUnknownFlagIsIgnoredWithAWarning.)
func TestUnknownFlagsAreToleratedOnRootAndProxy(t *testing.T) {
	// The missing root stops the run after the flags were parsed.
	code, _, stderr := runCLI("proxy", "--someUnknownFlag", "--root", t.TempDir()+"/missing", "-Z", "value", "sidecar")
	if code != 2 || strings.Contains(stderr, "unknown flag:") || strings.Contains(stderr, "unknown shorthand") || !strings.Contains(stderr, "--root") {
		t.Fatalf("proxy --someUnknownFlag: exit %d, stderr %q; want only the --root error", code, stderr)
	}
	if !strings.Contains(stderr, "ignoring unknown flags") || !strings.Contains(stderr, "--someUnknownFlag") || !strings.Contains(stderr, "-Z") {
		t.Fatalf("no warning naming the unknown flags: %q", stderr)
	}
	code, out, stderr := runCLI("--someUnknownFlag")
	if code != 0 || !strings.Contains(stderr, "--someUnknownFlag") || !strings.Contains(out, "Usage:") {
		t.Fatalf("meshagent --someUnknownFlag: exit %d, stdout %q, stderr %q; want help and a warning", code, out, stderr)
	}
	// Other commands are strict, as Istio's are.
	if code, _, stderr := runCLI("wait", "--bogus"); code != 2 || !strings.Contains(stderr, "unknown flag: --bogus") {
		t.Fatalf("wait --bogus: exit %d, stderr %q", code, stderr)
	}
}

func TestUnknownFlags(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.String("root", "", "")
	fs.BoolP("chaos", "c", false, "")
	fs.Lookup("chaos").NoOptDefVal = "true"
	fs.StringP("domain", "d", "", "")
	got := unknownFlags(fs, []string{"proxy", "--root", "--x-looks-like-a-value", "--a", "v", "--b=1", "-c", "-dz", "-q",
		"sidecar", "--", "--after"})
	if want := []string{"--a", "--b", "-q"}; !slices.Equal(got, want) {
		t.Fatalf("unknownFlags = %q, want %q", got, want)
	}
}

// Every bad value is reported at once, each naming its flag or variable
// and the value, with exit code 2.
func TestBadValuesAreReportedTogether(t *testing.T) {
	t.Setenv("ISTIO_DELTA_XDS", "maybe")
	t.Setenv("SECRET_TTL", "soon")
	code, _, stderr := runCLI("proxy", "--root", t.TempDir(), "--concurrency", "x", "--envoy-restarts", "-1")
	if code != 2 {
		t.Fatalf("exit %d, want 2: %s", code, stderr)
	}
	testkit.Contains(t, "the error", stderr, `--concurrency "x"`, `--envoy-restarts "-1"`, `ISTIO_DELTA_XDS="maybe"`, `SECRET_TTL="soon"`)
}

func TestBadValuesAreUsageErrors(t *testing.T) {
	root := t.TempDir()
	cases := [][]string{
		{"proxy", "--root", root + "/missing"},
		{"proxy", "--root", root, "gateway"},
		{"proxy", "--root", root, "--envoy-restarts", "-1"},
		{"proxy", "--root", root, "--stsPort", "15463"},
		{"proxy", "--root", root, "--log_output_level", "default:loud"},
		{"proxy", "--root", root, "--concurrency", "x"},
		{"proxy", "--root", root, "--restart-max-delay", "1ms"},
		{"version", "-o", "xml"},
		{"request", "--debug-port", "22", "GET", "/"},
		{"wait", "--timeoutSeconds", "0"},
	}
	for _, args := range cases {
		code, _, stderr := runCLI(args...)
		if code != 2 || stderr == "" {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 with a message", args, code, stderr)
		}
	}
}

func TestBadProxyConfigEnvNamesIt(t *testing.T) {
	t.Setenv("PROXY_CONFIG", "statusPort: [")
	code, _, stderr := runCLI("proxy", "--root", t.TempDir())
	if code != 2 || !strings.Contains(stderr, "PROXY_CONFIG") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI("version", "-s")
	if code != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("version -s: %d %q", code, out)
	}
	code, out, _ = runCLI("version", "-o", "json")
	if code != 0 || !strings.Contains(out, `"clientVersion"`) {
		t.Fatalf("version -o json: %d %q", code, out)
	}
}

func TestWaitUntilReady(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) < 3 {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	code, out, stderr := runCLI("wait", "--url", srv.URL, "--periodMillis", "10", "--timeoutSeconds", "30")
	if code != 0 || !strings.Contains(out, "Envoy is ready!") || calls.Load() != 3 {
		t.Fatalf("wait: exit %d after %d calls, out %q, err %q", code, calls.Load(), out, stderr)
	}
}

func TestWaitTimesOut(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "never", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	code, _, stderr := runCLI("wait", "--url", srv.URL, "--periodMillis", "10", "--timeoutSeconds", "1")
	if code != 1 || !strings.Contains(stderr, "timeout waiting for Envoy proxy to become ready") || !strings.Contains(stderr, "503") {
		t.Fatalf("wait: exit %d, err %q", code, stderr)
	}
}

// Each mistake is said once, in words that name its cause (#21).
func TestStartErrorsNameTheCauseOnce(t *testing.T) {
	root := t.TempDir()
	t.Setenv("PROXY_CONFIG", `{"binaryPath":"/bin/sh"}`) // an executable: no other error
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"proxy", "--root", root + "/missing"}, root + "/missing does not exist"},
		{[]string{"proxy", "--root", root, "banana"}, `unknown proxy type "banana"`},
		{[]string{"standalone", "--root", root}, "--mesh (MESHAGENT_MESH) is required"},
	} {
		code, _, stderr := runCLI(c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 and %q", c.args, code, stderr, c.want)
		}
		if lines := strings.Count(strings.TrimSpace(stderr), "\n") + 1; lines != 1 {
			t.Errorf("%q: %d lines, want the one error:\n%s", c.args, lines, stderr)
		}
	}
}

// configureOnHost runs a command line (proxy, standalone, vm) on host up to
// the agent it would start, and returns that agent's configuration, or nil
// with the exit code and what the command wrote.
func configureOnHost(host config.Host, args ...string) (*config.Plan, int, string) {
	var out bytes.Buffer
	var built *config.Plan
	code := execute(&cliContext{args: args, host: host, stdout: &out, stderr: &out,
		startAgent: func(cfg *config.Plan) error {
			built = cfg
			return nil
		}})
	if code != 0 || built == nil {
		return nil, max(code, 1), out.String()
	}
	return built, 0, out.String()
}

// A service's config that breaks the service's own rules stops the start
// as any bad value does: exit 2, the variable and the value named, once
// (#26: the check is the service's New, no longer a second one in cmd).
func TestServiceConfigErrorsAreUsageErrors(t *testing.T) {
	root := testkit.ShortTempDir(t, "ma")
	resolv := filepath.Join(root, "resolv.conf")
	testkit.WriteFile(t, resolv, []byte("nameserver 127.0.0.1\n"))
	host := config.Host{Env: config.MapEnvironment(map[string]string{"SECRET_GRACE_PERIOD_RATIO": "1.5"}), EUID: 1337, ResolvConf: resolv,
		InterfaceAddrs: func() ([]netip.Prefix, error) { return []netip.Prefix{netip.MustParsePrefix("10.9.8.7/24")}, nil }}
	cfg, code, out := configureOnHost(host, "proxy", "--root", root)
	if cfg != nil || code != 2 || strings.Count(out, "SECRET_GRACE_PERIOD_RATIO") != 1 || !strings.Contains(out, "1.5") {
		t.Errorf("SECRET_GRACE_PERIOD_RATIO=1.5: exit %d, output:\n%s\nwant exit 2 naming the variable and the value once", code, out)
	}
}

// POD_NAME is checked as Kubernetes checks a pod name (#33: 100 KB, or
// unicode, were taken): a usage error naming the variable, exit 2.
func TestBadPodNameIsAUsageError(t *testing.T) {
	for _, name := range []string{strings.Repeat("a", 100<<10), "ré-views", "Reviews", "-app"} {
		t.Setenv("POD_NAME", name)
		code, _, stderr := runCLI("proxy", "--root", t.TempDir())
		if code != 2 || !strings.Contains(stderr, "POD_NAME") || !strings.Contains(stderr, "Kubernetes pod name") || len(stderr) > 4<<10 {
			t.Errorf("POD_NAME of %d bytes: exit %d, stderr %.300q; want 2 naming POD_NAME, briefly", len(name), code, stderr)
		}
	}
}

// COMPLIANCE_POLICY is read once and reaches Envoy's bootstrap, the CA
// client and the XDS upstream (#35); a value Istio does not know stops the
// start with exit 2, naming the variable, the value and the known ones.
func TestCompliancePolicy(t *testing.T) {
	root := testkit.ShortTempDir(t, "ma")
	resolv := filepath.Join(root, "resolv.conf")
	testkit.WriteFile(t, resolv, []byte("nameserver 127.0.0.1\n"))
	host := func(policy string) config.Host {
		return config.Host{Env: config.MapEnvironment(map[string]string{"COMPLIANCE_POLICY": policy}), EUID: 1337, ResolvConf: resolv,
			InterfaceAddrs: func() ([]netip.Prefix, error) { return []netip.Prefix{netip.MustParsePrefix("10.9.8.7/24")}, nil }}
	}
	cfg, code, out := configureOnHost(host("pqc"), "proxy", "--root", root)
	if cfg == nil {
		t.Fatalf("COMPLIANCE_POLICY=pqc: exit %d:\n%s", code, out)
	}
	tc := cfg.Tree
	if tc.Certs.CompliancePolicy != compliance.PQC || tc.XDS.CompliancePolicy != compliance.PQC || tc.Envoy.Bootstrap.CompliancePolicy != "pqc" {
		t.Errorf("policy: certs %q, xds %q, envoy %q; want pqc in all three",
			tc.Certs.CompliancePolicy, tc.XDS.CompliancePolicy, tc.Envoy.Bootstrap.CompliancePolicy)
	}
	if slices.ContainsFunc(tc.Envoy.Env, func(v string) bool { return strings.HasPrefix(v, "GRPC_SSL_CIPHER_SUITES=") }) {
		t.Error("pqc set GRPC_SSL_CIPHER_SUITES in Envoy's environment; Istio sets it for the FIPS policies only")
	}
	cfg.Release()
	cfg, code, out = configureOnHost(host("fips-140-3"), "proxy", "--root", root)
	if cfg == nil {
		t.Fatalf("COMPLIANCE_POLICY=fips-140-3: exit %d:\n%s", code, out)
	}
	if !slices.Contains(cfg.Tree.Envoy.Env, "GRPC_SSL_CIPHER_SUITES=ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384") {
		t.Error("fips-140-3: Envoy's environment lacks Istio's GRPC_SSL_CIPHER_SUITES")
	}
	cfg.Release()
	cfg, code, out = configureOnHost(host("fips-140-4"), "proxy", "--root", root)
	if cfg != nil || code != 2 || !strings.Contains(out, `COMPLIANCE_POLICY="fips-140-4"`) || !strings.Contains(out, "pqc") {
		t.Errorf("COMPLIANCE_POLICY=fips-140-4: exit %d, output:\n%s\nwant exit 2 naming the variable, the value and the known ones", code, out)
	}
}
