package config

import (
	"bytes"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestProxyConfigDefaultsAreIstios(t *testing.T) {
	dir := t.TempDir()
	pc, err := loadProxyConfig(proxyConfigSources{meshConfigFile: dir + "/none", annotationsFile: dir + "/none"}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	if pc.StatusPort != 15020 || pc.ProxyAdminPort != 15000 || pc.BinaryPath != "/usr/local/bin/envoy" ||
		pc.ConfigPath != "./etc/istio/proxy" || pc.DiscoveryAddress != "istiod.istio-system.svc:15012" ||
		pc.GetDrainDuration().AsDuration().String() != "45s" || pc.GetTerminationDrainDuration().AsDuration().String() != "5s" ||
		pc.ControlPlaneAuthPolicy.String() != "MUTUAL_TLS" || pc.GetServiceCluster() != "istio-proxy" {
		t.Fatalf("defaults differ from Istio's: %v", pc)
	}
	if pc.Concurrency != nil {
		t.Fatalf("default concurrency %v: Istio's DefaultProxyConfig has none (it dropped its 2)", pc.Concurrency)
	}
	if err := validateProxyConfig(pc); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
}

// Istio's precedence: mesh file < PROXY_CONFIG < annotation; maps merge.
func TestProxyConfigLayering(t *testing.T) {
	dir := t.TempDir()
	mesh := filepath.Join(dir, "mesh")
	testkit.WriteFile(t, mesh, []byte(`
trustDomain: example.org
defaultConfig:
  statusPort: 16020
  proxyAdminPort: 16000
  binaryPath: /opt/envoy
  proxyMetadata:
    A: mesh
    B: mesh
`))
	ann := filepath.Join(dir, "annotations")
	testkit.WriteFile(t, ann, []byte(`proxy.istio.io/config="proxyAdminPort: 18000\nproxyMetadata:\n  B: annotation\n"
sidecar.istio.io/discoveryAddress="istiod.other:15012"
other="x"
`))
	pc, err := loadProxyConfig(proxyConfigSources{
		meshConfigFile:  mesh,
		proxyConfigEnv:  `{"proxy_admin_port": 17000, "terminationDrainDuration": "2s", "proxyMetadata": {"C": "env"}}`,
		annotationsFile: ann,
	}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	if pc.StatusPort != 16020 {
		t.Errorf("statusPort = %d, want 16020 from the mesh file", pc.StatusPort)
	}
	if pc.ProxyAdminPort != 18000 {
		t.Errorf("proxyAdminPort = %d, want 18000 from the annotation", pc.ProxyAdminPort)
	}
	if pc.BinaryPath != "/opt/envoy" {
		t.Errorf("binaryPath = %q", pc.BinaryPath)
	}
	if d := pc.GetTerminationDrainDuration().AsDuration().String(); d != "2s" {
		t.Errorf("terminationDrainDuration = %s, want 2s from PROXY_CONFIG", d)
	}
	if pc.DiscoveryAddress != "istiod.other:15012" {
		t.Errorf("discoveryAddress = %q, want the annotation's", pc.DiscoveryAddress)
	}
	want := map[string]string{"A": "mesh", "B": "annotation", "C": "env"}
	for k, v := range want {
		if pc.ProxyMetadata[k] != v {
			t.Errorf("proxyMetadata[%s] = %q, want %q (all: %v)", k, pc.ProxyMetadata[k], v, pc.ProxyMetadata)
		}
	}
	if pc.GetDrainDuration().AsDuration().String() != "45s" {
		t.Errorf("a default not overridden was lost: drainDuration %v", pc.GetDrainDuration())
	}
}

// An explicit zero overrides a default: statusPort 0 turns the server off.
func TestProxyConfigExplicitZero(t *testing.T) {
	dir := t.TempDir()
	pc, err := loadProxyConfig(proxyConfigSources{meshConfigFile: dir + "/x", annotationsFile: dir + "/x",
		proxyConfigEnv: "statusPort: 0"}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	if pc.StatusPort != 0 {
		t.Fatalf("statusPort = %d, want 0", pc.StatusPort)
	}
}

func TestProxyConfigBadInput(t *testing.T) {
	dir := t.TempDir()
	badMesh := filepath.Join(dir, "badmesh")
	testkit.WriteFile(t, badMesh, []byte("defaultConfig: [unclosed"))
	badAnn := filepath.Join(dir, "badann")
	testkit.WriteFile(t, badAnn, []byte("proxy.istio.io/config=\"statusPort: notanumber\"\n"))
	cases := []struct {
		name string
		src  proxyConfigSources
		want string
	}{
		{"PROXY_CONFIG not YAML", proxyConfigSources{proxyConfigEnv: "statusPort: [", meshConfigFile: dir + "/x", annotationsFile: dir + "/x"}, "PROXY_CONFIG"},
		{"PROXY_CONFIG wrong type", proxyConfigSources{proxyConfigEnv: `{"statusPort": "abc"}`, meshConfigFile: dir + "/x", annotationsFile: dir + "/x"}, "PROXY_CONFIG"},
		{"PROXY_CONFIG a list", proxyConfigSources{proxyConfigEnv: `[1,2]`, meshConfigFile: dir + "/x", annotationsFile: dir + "/x"}, "PROXY_CONFIG"},
		{"mesh file", proxyConfigSources{meshConfigFile: badMesh, annotationsFile: dir + "/x"}, badMesh},
		{"annotation", proxyConfigSources{meshConfigFile: dir + "/x", annotationsFile: badAnn}, "proxy.istio.io/config"},
	}
	for _, c := range cases {
		_, err := loadProxyConfig(c.src, quietLog())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one naming %q", c.name, err, c.want)
		}
	}
}

func TestProxyConfigUnknownFieldsWarn(t *testing.T) {
	var logs bytes.Buffer
	dir := t.TempDir()
	pc, err := loadProxyConfig(proxyConfigSources{meshConfigFile: dir + "/x", annotationsFile: dir + "/x",
		proxyConfigEnv: "statusPort: 25020\nnoSuchField: 1\ntracing:\n  bogus: true\n"}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if pc.StatusPort != 25020 {
		t.Fatalf("statusPort = %d", pc.StatusPort)
	}
	if !strings.Contains(logs.String(), "noSuchField") || !strings.Contains(logs.String(), "tracing.bogus") {
		t.Fatalf("unknown fields not reported: %s", logs.String())
	}
}

func TestValidateProxyConfig(t *testing.T) {
	cases := map[string]string{
		"statusPort: 70000":             "statusPort 70000",
		"proxyAdminPort: 0":             "proxyAdminPort 0",
		"statusPort: 15000":             "both 15000",
		`binaryPath: ""`:                "binaryPath",
		"discoveryAddress: nohostport":  "discoveryAddress",
		"discoveryAddress: istiod:0":    "bad port",
		"drainDuration: 0s":             "drainDuration",
		"terminationDrainDuration: -1s": "terminationDrainDuration",
	}
	dir := t.TempDir()
	for in, want := range cases {
		pc, err := loadProxyConfig(proxyConfigSources{meshConfigFile: dir + "/x", annotationsFile: dir + "/x", proxyConfigEnv: in}, quietLog())
		if err != nil {
			t.Errorf("%s: load: %v", in, err)
			continue
		}
		if err := validateProxyConfig(pc); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: validate = %v, want an error with %q", in, err, want)
		}
	}
}
