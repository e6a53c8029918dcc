package config

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
)

// Parsers of outside input read at start (#21): whatever a VM bundle's
// cluster.env or PROXY_CONFIG holds, the agent gets values that hold
// together or an error naming the source, never a panic. The seeds run in
// `make test`; `make fuzz` runs these longer (hack/fuzz.sh).

// FuzzClusterEnv: a VM bundle's cluster.env (and sidecar.env).
func FuzzClusterEnv(f *testing.F) {
	f.Add(sampleClusterEnv)
	for _, seed := range []string{
		"NOEQUALS\n", "A=$HOME\n", `A="$(id)"` + "\n", "A='unterminated\n", `A="x\"y"` + "\n",
		"export A=b # c\n", "A='x' trailing\n", "A=x;reboot\n", "\n\n# only comments\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		vars, err := parseEnvFile(strings.NewReader(text), "cluster.env")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "cluster.env") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		// What was read reads back the same, written as istioctl writes
		// it (a value with a single quote cannot be written so).
		var b strings.Builder
		for k, v := range vars {
			if !envFileName().MatchString(k) {
				t.Fatalf("accepted variable name %q", k)
			}
			if strings.ContainsAny(v, "'\n\r") {
				continue
			}
			fmt.Fprintf(&b, "%s='%s'\n", k, v)
		}
		again, err := parseEnvFile(strings.NewReader(b.String()), "again")
		if err != nil {
			t.Fatalf("%q read back: %v", b.String(), err)
		}
		for k, v := range again {
			if vars[k] != v {
				t.Fatalf("%s: %q read back as %q", k, vars[k], v)
			}
		}
	})
}

// FuzzProxyConfig: PROXY_CONFIG (and the mesh config's defaultConfig and
// the proxy.istio.io/config annotation, read the same way).
func FuzzProxyConfig(f *testing.F) {
	for _, seed := range []string{
		`{"statusPort":15020,"proxyAdminPort":15000,"binaryPath":"/usr/local/bin/envoy"}`,
		"concurrency: 2\nproxyMetadata:\n  ISTIO_META_DNS_CAPTURE: \"true\"\n",
		`{"tracing":{"zipkin":{"address":"z:9411"}},"drainDuration":"5s"}`,
		`{"statusPort":"abc"}`, `[1,2]`, "statusPort: [", `{"unknownField":1}`, `null`, ``,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		pc, err := overlayProxyConfig(defaultProxyConfig(), []byte(value), "PROXY_CONFIG", quietLog())
		if err != nil {
			if !strings.HasPrefix(err.Error(), "PROXY_CONFIG: ") {
				t.Fatalf("error %q does not name PROXY_CONFIG", err)
			}
			return
		}
		if pc == nil {
			t.Fatal("no ProxyConfig and no error")
		}
		if _, err := protojson.Marshal(pc); err != nil {
			t.Fatalf("the ProxyConfig read does not marshal: %v", err)
		}
		_ = validateProxyConfig(pc) // must not panic either
	})
}
