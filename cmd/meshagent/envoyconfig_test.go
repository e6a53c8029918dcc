package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/services/envoy"
)

// parseForTest parses a proxy command line and environment into the agent
// configuration, as the proxy command does.
func parseForTest(t *testing.T, env map[string]string, args ...string) (*agentConfig, error) {
	t.Helper()
	logs, f := &logOptions{}, &proxyFlags{}
	cmd := &cobra.Command{Use: "proxy"}
	addLogFlags(cmd.Flags(), logs)
	addProxyFlags(cmd.Flags(), f)
	if err := cmd.ParseFlags(args); err != nil {
		return nil, err
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	environ := func() []string {
		var kv []string
		for k, v := range env {
			kv = append(kv, k+"="+v)
		}
		return kv
	}
	return parseAgentConfig(cmd, f, logs, cmd.Flags().Args(), lookup, environ, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func TestEnvoyConfigFromEnvironment(t *testing.T) {
	root := t.TempDir()
	env := map[string]string{
		"POD_NAME": "reviews-v1-abc", "POD_NAMESPACE": "bookinfo", "INSTANCE_IP": "10.1.2.3",
		"SERVICE_ACCOUNT": "reviews", "ISTIO_META_DNS_CAPTURE": "true",
		"PROXY_CONFIG": `{"proxyAdminPort": 25000, "statusPort": 25020, "concurrency": 3}`,
	}
	cfg, err := parseForTest(t, env, "--root", root, "--proxyLogLevel", "info,misc:error")
	if err != nil {
		t.Fatal(err)
	}
	bc := cfg.envoyBootstrap()
	if err := bc.Validate(); err != nil {
		t.Fatalf("bootstrap config from env does not validate: %v", err)
	}
	b, err := envoy.WriteBootstrap(bc)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "etc/istio/proxy/envoy-rev.json"); b.Path != want {
		t.Fatalf("bootstrap at %s, want %s", b.Path, want)
	}
	data, _ := os.ReadFile(b.Path)
	for _, want := range []string{"sidecar~10.1.2.3~reviews-v1-abc.bookinfo~bookinfo.svc.cluster.local", `"port_value": 25000`,
		filepath.Join(root, "etc/istio/proxy/XDS"), filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket"), "localhost:15053"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("bootstrap lacks %q", want)
		}
	}
	args := envoy.CommandLine(cfg.envoyArgs(), b)
	for _, want := range [][]string{{"-l", "info"}, {"--component-log-level", "misc:error"}, {"--concurrency", "3"}, {"--drain-time-s", "45"}} {
		i := slices.Index(args, want[0])
		if i < 0 || i+1 >= len(args) || args[i+1] != want[1] {
			t.Errorf("args %v lack %v", args, want)
		}
	}
}

func TestEnvoyEnvBadValues(t *testing.T) {
	for _, kv := range [][2]string{{"ISTIO_DELTA_XDS", "maybe"}, {"MINIMUM_DRAIN_DURATION", "soon"}, {"ISTIO_CPU_LIMIT", "-2"}} {
		_, err := parseForTest(t, map[string]string{kv[0]: kv[1]}, "--root", t.TempDir())
		if err == nil || !strings.Contains(err.Error(), kv[0]) {
			t.Errorf("%s=%s: err = %v, want one naming the variable", kv[0], kv[1], err)
		}
	}
}
