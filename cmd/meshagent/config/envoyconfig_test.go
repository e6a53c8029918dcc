package config

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/services/envoy/bootstrap"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/services/sds"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// testHost is a host filled by hand: the given environment, a non-root
// agent, one private address, no users, an empty resolv.conf.
func testHost(t *testing.T, env map[string]string) Host {
	t.Helper()
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 10.96.0.10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return Host{
		Env:  MapEnvironment(env),
		EUID: 1337,
		InterfaceAddrs: func() ([]netip.Prefix, error) {
			return []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("10.9.8.7/24")}, nil
		},
		LookupUID: func(string) (string, error) { return "", errors.New("no such user") },
		// The real probes: the tests mount files and serve sockets under
		// their root.
		FileExists: func(p string) bool { _, err := os.Stat(p); return err == nil },
		SocketLive: sds.SocketLive,
		ResolvConf: resolv,
	}
}

// testRoot is a fresh --root, short enough for the unix sockets under it
// (107 bytes at most).
func testRoot(t *testing.T) string {
	t.Helper()
	root := testkit.ShortTempDir(t, "ma")
	return root
}

// parseForTest runs a proxy command line and environment through the
// configuration pipeline, as the proxy command does, on testHost.
func parseForTest(t *testing.T, env map[string]string, args ...string) (*Plan, error) {
	t.Helper()
	return parseOnHost(t, testHost(t, env), args...)
}

func parseOnHost(t *testing.T, host Host, args ...string) (*Plan, error) {
	t.Helper()
	return parseWith(t, host, nil, args...)
}

// parseWith is parseOnHost with what a command other than proxy adds to
// the inputs (adjust: nil for none).
func parseWith(t *testing.T, host Host, adjust func(*Inputs), args ...string) (*Plan, error) {
	t.Helper()
	f := &ProxyFlags{}
	cmd := &cobra.Command{Use: "proxy"}
	logs := addTestLogFlags(cmd)
	s := NewSettings(cmd.Flags())
	BindProxyFlags(s, f)
	if err := cmd.ParseFlags(args); err != nil {
		return nil, err
	}
	_ = s.Resolve(host.Env)
	in := Inputs{Flags: f, Args: cmd.Flags().Args(), LogLevel: *logs.level, LogAsJSON: *logs.asJSON, Version: testVersion, Host: host,
		Problems: s.Problems, Log: quietLog()}
	if adjust != nil {
		adjust(&in)
	}
	return Build(in)
}

// testVersion is the agent's version in the configuration tests.
const testVersion = "1.2.3-test"

// testLogFlags are Istio's logging flags as the commands define them (cmd's
// logging.go): the configuration checks the level and passes on JSON.
type testLogFlags struct {
	level  *string
	asJSON *bool
}

func addTestLogFlags(cmd *cobra.Command) testLogFlags {
	return testLogFlags{
		level:  cmd.Flags().String("log_output_level", "default:info", ""),
		asJSON: cmd.Flags().Bool("log_as_json", false, ""),
	}
}

// writeEnvoyBootstrap writes the bootstrap the envoy service would write
// before starting Envoy, and returns it with Envoy's command line.
func writeEnvoyBootstrap(t *testing.T, cfg *Plan) (bootstrap.File, string, []string) {
	t.Helper()
	ec := cfg.Tree.Envoy
	if ec == nil || ec.Bootstrap == nil {
		t.Fatal("no envoy config")
	}
	if err := ec.Bootstrap.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := bootstrap.Render(*ec.Bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	b := r.File
	data, err := os.ReadFile(b.Path)
	if err != nil {
		t.Fatal(err)
	}
	return b, string(data), envoy.CommandLine(ec.Args, b)
}

// argValue is the value after flag in Envoy's command line, "" if absent.
func argValue(args []string, flag string) string {
	i := slices.Index(args, flag)
	if i < 0 || i+1 >= len(args) {
		return ""
	}
	return args[i+1]
}

func TestEnvoyConfigFromEnvironment(t *testing.T) {
	root := testRoot(t)
	env := map[string]string{
		"POD_NAME": "reviews-v1-abc", "POD_NAMESPACE": "bookinfo", "INSTANCE_IP": "10.1.2.3",
		"SERVICE_ACCOUNT": "reviews", "ISTIO_META_DNS_CAPTURE": "true",
		"PROXY_CONFIG": `{"proxyAdminPort": 25000, "statusPort": 25020, "concurrency": 3}`,
	}
	cfg, err := parseForTest(t, env, "--root", root, "--proxyLogLevel", "info,misc:error")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Tree.Envoy.Bootstrap.Validate(); err != nil {
		t.Fatalf("bootstrap config from env does not validate: %v", err)
	}
	b, data, args := writeEnvoyBootstrap(t, cfg)
	if want := filepath.Join(root, "etc/istio/proxy/envoy-rev.json"); b.Path != want {
		t.Fatalf("bootstrap at %s, want %s", b.Path, want)
	}
	testkit.Contains(t, "bootstrap", data, "sidecar~10.1.2.3~reviews-v1-abc.bookinfo~bookinfo.svc.cluster.local", `"port_value": 25000`,
		filepath.Join(root, "etc/istio/proxy/XDS"), filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket"), `"DNS_CAPTURE": "true"`)
	for _, want := range [][]string{{"-l", "info"}, {"--component-log-level", "misc:error"}, {"--concurrency", "3"}, {"--drain-time-s", "45"}} {
		if got := argValue(args, want[0]); got != want[1] {
			t.Errorf("args %v: %s %q, want %q", args, want[0], got, want[1])
		}
	}
}

func TestEnvoyEnvBadValues(t *testing.T) {
	for _, kv := range [][2]string{{"ISTIO_DELTA_XDS", "maybe"}, {"MINIMUM_DRAIN_DURATION", "soon"}, {"ISTIO_CPU_LIMIT", "-2"},
		{"ENVOY_STATUS_PORT", "70000"}, {"ENVOY_PROMETHEUS_PORT", "x"}, {"PEER_METADATA_DISCOVERY", "yes please"}} {
		_, err := parseForTest(t, map[string]string{kv[0]: kv[1]}, "--root", testRoot(t))
		if err == nil || !strings.Contains(err.Error(), kv[0]) || !strings.Contains(err.Error(), kv[1]) {
			t.Errorf("%s=%s: err = %v, want one naming the variable and the value", kv[0], kv[1], err)
		}
	}
}
