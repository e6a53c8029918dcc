package config

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// standaloneHost is where the standalone configuration tests find Envoy:
// only the stand-in, in the directory of a meshagent binary.
type standaloneHost struct {
	host    Host
	selfDir string
	// installed are the executables lookPath finds, by name or path.
	installed map[string]string
}

func (h standaloneHost) LookPath(name string) (string, error) {
	if p, ok := h.installed[name]; ok {
		return p, nil
	}
	return "", exec.ErrNotFound
}

func newStandaloneHost(t *testing.T, env map[string]string) standaloneHost {
	selfDir := t.TempDir()
	standIn := filepath.Join(selfDir, "fakeenvoy")
	return standaloneHost{host: testHost(t, env), selfDir: selfDir, installed: map[string]string{standIn: standIn}}
}

// parseStandalone runs a standalone command line through the pipeline, as
// the standalone command does.
func parseStandalone(t *testing.T, h standaloneHost, args ...string) (*Plan, EnvoyChoice, error) {
	t.Helper()
	f, sf := &ProxyFlags{}, &StandaloneFlags{}
	cmd := &cobra.Command{Use: "standalone"}
	logs := addTestLogFlags(cmd)
	s := NewSettings(cmd.Flags())
	BindProxyFlags(s, f)
	BindStandaloneFlags(s, sf)
	if err := cmd.ParseFlags(args); err != nil {
		return nil, EnvoyChoice{}, err
	}
	_ = s.Resolve(h.host.Env)
	return BuildStandalone(StandaloneInputs{
		Inputs: Inputs{Flags: f, LogLevel: *logs.level, LogAsJSON: *logs.asJSON, Version: testVersion, Host: h.host, Problems: s.Problems, Log: quietLog()},
		Flags:  sf, LookPath: h.LookPath, SelfDir: h.selfDir,
	})
}

func sampleMesh(t *testing.T) string {
	t.Helper()
	mesh := filepath.Join(t.TempDir(), "mesh.yaml")
	testkit.WriteFile(t, mesh, []byte("services: []\n"))
	return mesh
}

// With nothing else given, the agent is wired to the embedded peers as an
// injected pod is to istiod: xDS in plaintext to the control plane, its CSR
// to the CA (verified with the CA's own root, under --root), DNS capture
// with NDS from the control plane, and a workload identity.
func TestStandaloneWiresTheAgentToItsPeers(t *testing.T) {
	root, mesh, h := testRoot(t), sampleMesh(t), newStandaloneHost(t, nil)
	cfg, envoy, err := parseStandalone(t, h, "--root", root, "--mesh", mesh)
	if err != nil {
		t.Fatal(err)
	}
	tc := cfg.Tree
	if tc.ControlPlane == nil || tc.CA == nil {
		t.Fatalf("peers: control plane %v, CA %v", tc.ControlPlane, tc.CA)
	}
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"control plane address", tc.ControlPlane.Listen, "127.0.0.1:16010"},
		{"mesh file", tc.ControlPlane.MeshFile, mesh},
		{"discovery address", tc.XDS.DiscoveryAddress, "127.0.0.1:16010"},
		{"xDS in plaintext", tc.XDS.Plaintext, true},
		{"NDS", tc.XDS.NDS, true},
		{"DNS proxy on", tc.DNS != nil, true},
		{"CA address", tc.CA.Listen, "127.0.0.1:16012"},
		{"CA root under --root", tc.CA.RootDir, filepath.Join(root, "var/lib/meshagent/ca")},
		{"certificate lifetime", tc.CA.CertLifetime, time.Minute},
		{"certificate source", tc.Certs.Source, certs.SourceCA},
		{"agent's CA", tc.Certs.CAAddr, tc.CA.Listen},
		{"agent trusts the CA's root", tc.Certs.CARootFile, tc.CA.RootCertPath()},
		{"CA over TLS", tc.Certs.CAPlaintext, false},
		{"CA signs the agent's trust domain", tc.CA.TrustDomain, tc.Certs.TrustDomain},
		{"token", tc.Certs.TokenFile, filepath.Join(root, "var/run/secrets/tokens/istio-token")},
		{"SPIFFE ID", tc.Certs.SpiffeID(), "spiffe://cluster.local/ns/default/sa/default"},
		{"pod name", tc.Envoy.Bootstrap.PodName, "standalone-0"},
		{"node IP", tc.Envoy.Bootstrap.InstanceIPs[0], "127.0.0.1"},
		{"envoy", tc.Envoy.BinaryPath, filepath.Join(h.selfDir, "fakeenvoy")},
		{"envoy as logged", envoy.Path, tc.Envoy.BinaryPath},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if !strings.Contains(envoy.Why, "stand-in") {
		t.Errorf("the log would not say the stand-in runs: %q", envoy.Why)
	}
}

// What the user sets wins over what standalone sets: flags, then the
// environment (PROXY_CONFIG field by field, POD_NAME, TRUST_DOMAIN), while
// standalone's wiring stays where the user said nothing. An empty variable
// counts as unset.
func TestStandaloneUserSettingsWin(t *testing.T) {
	h := newStandaloneHost(t, map[string]string{
		"PROXY_CONFIG":        `{"statusPort": 25020, "binaryPath": "/opt/envoy/bin/envoy"}`,
		"POD_NAME":            "mine-7",
		"POD_NAMESPACE":       "",
		"TRUST_DOMAIN":        "example.org",
		"MESHAGENT_CA_LISTEN": "127.0.0.1:26012",
	})
	cfg, envoy, err := parseStandalone(t, h, "--root", testRoot(t), "--mesh", sampleMesh(t),
		"--controlplane-listen", "127.0.0.1:26010", "--cert-lifetime", "10s")
	if err != nil {
		t.Fatal(err)
	}
	tc := cfg.Tree
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"status port", tc.Status.Addr, ":25020"},
		{"pod name", tc.Envoy.Bootstrap.PodName, "mine-7"},
		{"namespace (empty = unset)", tc.Envoy.Bootstrap.PodNamespace, "default"},
		{"discovery address", tc.XDS.DiscoveryAddress, "127.0.0.1:26010"},
		{"control plane", tc.ControlPlane.Listen, "127.0.0.1:26010"},
		{"CA", tc.CA.Listen, "127.0.0.1:26012"},
		{"agent's CA", tc.Certs.CAAddr, "127.0.0.1:26012"},
		{"CA's trust domain", tc.CA.TrustDomain, "example.org"},
		{"certificate lifetime", tc.CA.CertLifetime, 10 * time.Second},
		{"envoy", tc.Envoy.BinaryPath, "/opt/envoy/bin/envoy"},
		{"envoy as logged", envoy.Path, "/opt/envoy/bin/envoy"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if !strings.Contains(envoy.Why, "binaryPath is set") {
		t.Errorf("envoy: why = %q, want it to say the configuration chose it", envoy.Why)
	}
}

// Envoy: Istio's binaryPath if installed, else envoy on PATH, else the
// stand-in beside meshagent; with none of them, a startup error that says
// how to get one.
func TestStandaloneFindsEnvoy(t *testing.T) {
	h := newStandaloneHost(t, nil)
	standIn := filepath.Join(h.selfDir, "fakeenvoy")
	for _, c := range []struct {
		installed map[string]string
		want, Why string
	}{
		{map[string]string{envoyBinaryPath: envoyBinaryPath, "envoy": "/usr/bin/envoy", standIn: standIn}, envoyBinaryPath, "Istio's binaryPath"},
		{map[string]string{"envoy": "/usr/bin/envoy", standIn: standIn}, "/usr/bin/envoy", "on PATH"},
		{map[string]string{standIn: standIn}, standIn, "stand-in"},
	} {
		h.installed = c.installed
		got := findEnvoy(h.LookPath, h.selfDir)
		if got.Path != c.want || !strings.Contains(got.Why, c.Why) {
			t.Errorf("with %v: %+v, want %s (%s)", c.installed, got, c.want, c.Why)
		}
	}
	h.installed = nil
	_, _, err := parseStandalone(t, h, "--root", testRoot(t), "--mesh", sampleMesh(t))
	if err == nil || !strings.Contains(err.Error(), "no Envoy") || !strings.Contains(err.Error(), "make fakeenvoy") {
		t.Errorf("no Envoy anywhere: err = %v", err)
	}
}

// The mesh file is required and must exist: a path that works only from
// the source tree would fail confusingly anywhere else. Every bad value is
// reported at once.
func TestStandaloneMeshIsRequired(t *testing.T) {
	h := newStandaloneHost(t, nil)
	_, _, err := parseStandalone(t, h, "--root", testRoot(t), "--cert-lifetime", "0s")
	if err == nil || !strings.Contains(err.Error(), "--mesh") || !strings.Contains(err.Error(), "required") ||
		!strings.Contains(err.Error(), "--cert-lifetime") {
		t.Errorf("no --mesh, zero lifetime: err = %v", err)
	}
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	_, _, err = parseStandalone(t, h, "--root", testRoot(t), "--mesh", missing)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing --mesh file: err = %v", err)
	}
}

// Dev certificates left under --root (by an older `make run`) would make
// the agent use files instead of the CA: standalone refuses and says which
// directory to remove.
func TestStandaloneRefusesFileMountedCertificates(t *testing.T) {
	root := testRoot(t)
	for _, name := range []string{"cert-chain.pem", "key.pem", "root-cert.pem"} {
		testkit.WriteFile(t, filepath.Join(root, "etc/certs", name), []byte("x"))
	}
	_, _, err := parseStandalone(t, newStandaloneHost(t, nil), "--root", root, "--mesh", sampleMesh(t))
	if err == nil || !strings.Contains(err.Error(), "embedded CA") || !strings.Contains(err.Error(), filepath.Join(root, "etc/certs")) {
		t.Errorf("file-mounted certs under --root: err = %v", err)
	}
}

// The environment Envoy and the pipeline see: the user's variables, then
// standalone's for those the user leaves unset or empty.
func TestStandaloneEnvironmentDefaults(t *testing.T) {
	env := withDefaults(MapEnvironment(map[string]string{"A": "mine", "B": "", "C": "c"}), map[string]string{"A": "std", "B": "std", "D": "std"})
	for name, want := range map[string]string{"A": "mine", "B": "std", "C": "c", "D": "std"} {
		if got, ok := env.source().Get(name); !ok || got != want {
			t.Errorf("%s = %q, %v; want %q", name, got, ok, want)
		}
	}
	all := strings.Join(env.source().All(), " ")
	for _, kv := range []string{"A=mine", "B=std", "C=c", "D=std"} {
		if !strings.Contains(all, kv) {
			t.Errorf("all() = %q lacks %s", all, kv)
		}
	}
	if strings.Contains(all, "A=std") || strings.Contains(all, "B= ") || strings.HasSuffix(all, "B=") {
		t.Errorf("all() = %q holds an overridden value", all)
	}
}
