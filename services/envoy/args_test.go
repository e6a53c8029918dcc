package envoy

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/services/envoy/bootstrap"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestCommandLine(t *testing.T) {
	b := bootstrap.File{Path: "./etc/istio/proxy/envoy-rev.json"}
	base := []string{
		"-c", "./etc/istio/proxy/envoy-rev.json",
		"--drain-time-s", "45",
		"--drain-strategy", "immediate",
		"--local-address-ip-version", "v4",
		"--file-flush-interval-msec", "1000",
		"--disable-hot-restart",
		"--allow-unknown-static-fields",
	}
	with := func(extra ...string) []string { return append(slices.Clone(base), extra...) }
	for _, tc := range []struct {
		name string
		edit func(*ArgsConfig, *bootstrap.File)
		want []string
	}{
		{"defaults", func(*ArgsConfig, *bootstrap.File) {}, with("-l", "warning", "--skip-deprecated-logs")},
		{"log level with components", func(a *ArgsConfig, _ *bootstrap.File) {
			a.LogLevel, a.ComponentLogLevel = "info,misc:error", "ignored:debug"
		}, with("-l", "info", "--component-log-level", "misc:error", "--skip-deprecated-logs")},
		{"component level flag used without components", func(a *ArgsConfig, _ *bootstrap.File) {
			a.LogLevel, a.ComponentLogLevel = "debug", "upstream:trace,http:info"
		}, with("-l", "debug", "--component-log-level", "upstream:trace,http:info", "--skip-deprecated-logs")},
		{"only components, bad entry dropped", func(a *ArgsConfig, _ *bootstrap.File) {
			a.LogLevel = "misc:error,a:b:c,upstream:debug"
		}, with("--component-log-level", "misc:error,upstream:debug", "--skip-deprecated-logs")},
		{"concurrency 0 omitted, skip-deprecated-logs off", func(a *ArgsConfig, _ *bootstrap.File) {
			a.Concurrency, a.SkipDeprecatedLogs, a.LogLevel = 0, false, ""
		}, with()},
		{"concurrency", func(a *ArgsConfig, _ *bootstrap.File) { a.Concurrency = 4 },
			with("-l", "warning", "--skip-deprecated-logs", "--concurrency", "4")},
		{"ipv6, drain, flush", func(a *ArgsConfig, _ *bootstrap.File) {
			a.IPv6, a.DrainDuration, a.FileFlushInterval, a.FileFlushMinSizeKB = true, 90*time.Second+500*time.Millisecond, 250*time.Millisecond, 32
		}, func() []string {
			w := with("--file-flush-min-size-kb", "32", "-l", "warning", "--skip-deprecated-logs")
			w[3], w[7], w[9] = "90", "v6", "250"
			return w
		}()},
		{"everything, Istio's order", func(a *ArgsConfig, b *bootstrap.File) {
			a.EnableCoreDump, a.Concurrency, a.LogLevel = true, 2, "info,misc:error"
			b.ConfigYAML = `{"tracing":{}}`
		}, with("-l", "info", "--component-log-level", "misc:error", "--skip-deprecated-logs", "--enable-core-dump",
			"--config-yaml", `{"tracing":{}}`, "--concurrency", "2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, bb := istioArgs(), b
			tc.edit(&a, &bb)
			if got := CommandLine(a, bb); !slices.Equal(got, tc.want) {
				t.Errorf("CommandLine =\n  %q\nwant\n  %q", got, tc.want)
			}
		})
	}
}

// updateGolden rewrites testdata/sidecar.args.golden: go test ./services/envoy -run Golden -update
var updateGolden = flag.Bool("update", false, "rewrite testdata/sidecar.args.golden")

// TestCommandLineGolden pins the full default command line with an override
// (ISTIO_BOOTSTRAP_OVERRIDE as bootstrap.Render turns it into JSON), as Envoy
// would be run.
func TestCommandLineGolden(t *testing.T) {
	b := bootstrap.File{
		Path:       "./etc/istio/proxy/envoy-rev.json",
		ConfigYAML: `{"tracing":{"http":{"name":"envoy.tracers.zipkin","typed_config":{"@type":"type.googleapis.com/envoy.config.trace.v3.ZipkinConfig","collector_cluster":"10.128.0.5:9411","collector_endpoint":"/api/v2/spans"}}}}`,
	}
	a := istioArgs()
	a.Concurrency = 2
	got := strings.Join(CommandLine(a, b), "\n") + "\n"
	golden := filepath.Join("testdata", "sidecar.args.golden")
	if *updateGolden {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("command line differs from %s:\n%s", golden, testkit.LineDiff(string(want), got))
	}
}

// istioArgs is the command line config cmd builds by default (Istio's defaults for a sidecar).
func istioArgs() ArgsConfig {
	return ArgsConfig{
		DrainDuration:      45 * time.Second,
		FileFlushInterval:  time.Second,
		LogLevel:           "warning",
		SkipDeprecatedLogs: true,
	}
}
