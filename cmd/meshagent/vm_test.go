package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// A cluster.env as istioctl writes it, with what people add by hand.
const sampleClusterEnv = `# written by istioctl x workload entry configure
CANONICAL_REVISION='latest'
CANONICAL_SERVICE='vm-app'
ISTIO_INBOUND_PORTS='*'

ISTIO_LOCAL_EXCLUDE_PORTS='15090,15021,15020'
ISTIO_METAJSON_LABELS='{"app":"vm-app","service.istio.io/canonical-name":"vm-app"}'
ISTIO_META_CLUSTER_ID="Kubernetes"
ISTIO_META_MESH_ID=''
export ISTIO_NAMESPACE=vm-ns
ISTIO_SERVICE="vm-app.vm-ns" # the service
ESCAPED="a \"quoted\" \$word"
ISTIO_SERVICE_CIDR='*'
ISTIO_SERVICE_CIDR='10.0.0.0/8'
`

func writeEnvFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cluster.env")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadEnvFileReadsIstioctlsClusterEnv(t *testing.T) {
	vars, err := readEnvFile(writeEnvFile(t, sampleClusterEnv))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"CANONICAL_REVISION":    "latest",
		"ISTIO_INBOUND_PORTS":   "*",
		"ISTIO_METAJSON_LABELS": `{"app":"vm-app","service.istio.io/canonical-name":"vm-app"}`,
		"ISTIO_META_CLUSTER_ID": "Kubernetes",
		"ISTIO_META_MESH_ID":    "",
		"ISTIO_NAMESPACE":       "vm-ns",
		"ISTIO_SERVICE":         "vm-app.vm-ns",
		"ESCAPED":               `a "quoted" $word`,
		"ISTIO_SERVICE_CIDR":    "10.0.0.0/8", // the later line wins, as in a shell
	}
	for k, v := range want {
		if vars[k] != v {
			t.Errorf("%s = %q, want %q", k, vars[k], v)
		}
	}
	if len(vars) != 11 {
		t.Errorf("%d variables, want 11: %v", len(vars), vars)
	}
}

// What a shell would expand or choke on is refused, naming file:line,
// never read as a different value than bash would see.
func TestReadEnvFileRefusesWhatOnlyAShellUnderstands(t *testing.T) {
	for _, line := range []string{
		"NOEQUALS",
		"1BAD=x",
		"A=$HOME",
		`A="$(id)"`,
		"A=`id`",
		"A='unterminated",
		`A="unterminated`,
		"A='x' trailing",
		"A=x;reboot",
	} {
		p := writeEnvFile(t, "# comment\nGOOD='1'\n"+line+"\n")
		_, err := readEnvFile(p)
		if err == nil || !strings.Contains(err.Error(), p+":3:") {
			t.Errorf("%q: error %v, want one naming %s:3", line, err, p)
		}
	}
}

// As istio-start.sh: the files win over the process environment, and the
// script's defaults fill what neither sets.
func TestVMEnvironmentFilesWinThenIstioStartDefaults(t *testing.T) {
	root := t.TempDir()
	writeRootFile(t, root, clusterEnvFile, "ISTIO_NAMESPACE='vm-ns'\nISTIO_SERVICE='vm-app'\nPILOT_ADDRESS='istiod.example:15012'\nPOD_NAME='from-file'\n")
	writeRootFile(t, root, sidecarEnvFile, "ISTIO_SERVICE='from-sidecar-env'\nISTIO_CP_AUTH='NONE'\n")
	host := hostInputs{
		env:      mapEnvironment(map[string]string{"POD_NAME": "from-env", "OUTPUT_CERTS": "/out"}),
		hostname: func() (string, error) { return "vm1.example.com", nil },
	}
	env, err := vmEnvironment(root, &vmFlags{clusterEnv: clusterEnvFile, sidecarEnv: sidecarEnvFile}, host)
	if err != nil {
		t.Fatal(err)
	}
	wantEnv(t, env, map[string]string{
		"POD_NAME":      "from-file",
		"POD_NAMESPACE": "vm-ns",
		"CA_ADDR":       "istiod.example:15012",
		"PROV_CERT":     "/etc/certs",
		"OUTPUT_CERTS":  "/out",
		"PROXY_CONFIG":  "serviceCluster: vm-app\ncontrolPlaneAuthPolicy: NONE\ndiscoveryAddress: istiod.example:15012\n",
	})

	writeRootFile(t, root, clusterEnvFile, "ISTIO_SYSTEM_NAMESPACE='mesh'\n")
	env, err = vmEnvironment(root, &vmFlags{clusterEnv: clusterEnvFile, sidecarEnv: "./none"}, host)
	if err != nil {
		t.Fatal(err)
	}
	wantEnv(t, env, map[string]string{
		"POD_NAME":      "from-env",
		"POD_NAMESPACE": "default",
		"CA_ADDR":       "istiod.mesh.svc:15012",
		"PROXY_CONFIG":  "serviceCluster: rawvm\ncontrolPlaneAuthPolicy: MUTUAL_TLS\n",
	})
	host.env = mapEnvironment(nil)
	if env, err = vmEnvironment(root, &vmFlags{clusterEnv: clusterEnvFile, sidecarEnv: "./none"}, host); err != nil {
		t.Fatal(err)
	}
	wantEnv(t, env, map[string]string{"POD_NAME": "vm1"}) // hostname -s
}

func wantEnv(t *testing.T, env *config.Reader, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got, _ := env.Text(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
}

// writeRootFile writes a file at an Istio path under root.
func writeRootFile(t *testing.T, root, rel, text string) {
	t.Helper()
	writeFile(t, rooted(root, rel), text)
}

// A bad cluster.env line stops the agent before anything starts: exit 2,
// naming file:line. A missing cluster.env names the path it looked at.
func TestVMRefusesABadOrMissingClusterEnv(t *testing.T) {
	root := t.TempDir()
	code, _, stderr := runCLI("vm", "--root", root)
	if want := rooted(root, clusterEnvFile); code != 2 || !strings.Contains(stderr, want+" does not exist") {
		t.Fatalf("missing cluster.env: exit %d, stderr %q; want 2 naming %s", code, stderr, want)
	}
	writeRootFile(t, root, clusterEnvFile, "ISTIO_NAMESPACE='vm-ns'\nISTIO_SERVICE_CIDR=$CIDR\n")
	code, _, stderr = runCLI("vm", "--root", root)
	if want := rooted(root, clusterEnvFile) + ":2:"; code != 2 || !strings.Contains(stderr, want) {
		t.Fatalf("bad line: exit %d, stderr %q; want 2 naming %s", code, stderr, want)
	}
}

// The unit passes systemd's own checks.
func TestVMUnitVerifies(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("needs systemd-analyze")
	}
	dir := t.TempDir()
	unit, err := os.ReadFile("meshagent.service")
	if err != nil {
		t.Fatal(err)
	}
	// systemd-analyze checks that ExecStart's binary exists: point the
	// unit at the binary under test.
	text := strings.ReplaceAll(string(unit), "/usr/local/bin/meshagent", agentBinary)
	if err := os.WriteFile(filepath.Join(dir, "meshagent.service"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", "--man=no", filepath.Join(dir, "meshagent.service")).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	testkit.Contains(t, "unit", string(unit), "Type=notify", "WatchdogSec=30s", "Restart=on-failure", "ExecStart=/usr/local/bin/meshagent vm", "ExecStopPost=-/usr/local/bin/meshagent vm clean")
}

// Envoy's user is the one the capture rules exempt: the uid of
// $ENVOY_USER when it exists, else 1337; with TPROXY Envoy stays root, as
// Istio's script runs it. Envoy's sockets (XDS and SDS) are chowned to it.
func TestVMProxyUserIsTheOneTheRulesExempt(t *testing.T) {
	host := testHost(t, nil)
	u, err := vmProxyUser(host)
	if err != nil || u.UID != 1337 || u.GID != 1337 || u.envoy == nil || *u.envoy != (envoy.Credential{UID: 1337, GID: 1337}) {
		t.Fatalf("no istio-proxy user: %+v, %v; want 1337:1337", u, err)
	}
	host.lookupUID = func(name string) (string, error) {
		if name == "istio-proxy" {
			return "998", nil
		}
		return "", errors.New("no such user")
	}
	if u, err = vmProxyUser(host); err != nil || u.UID != 998 || u.GID != 998 {
		t.Fatalf("istio-proxy is uid 998: %+v, %v", u, err)
	}
	host.env = mapEnvironment(map[string]string{"ISTIO_INBOUND_INTERCEPTION_MODE": "TPROXY"})
	if u, err = vmProxyUser(host); err != nil || u.envoy != nil || u.envoyUID() != 0 {
		t.Fatalf("TPROXY: %+v, %v; want Envoy as root", u, err)
	}

	u, _ = vmProxyUser(testHost(t, nil))
	cfg, err := parseWith(t, testHost(t, nil), func(in *agentInputs) { in.envoyRunAs, in.noCapture = u.envoy, true }, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.tree.Envoy.RunAs == nil || cfg.tree.XDS.SocketOwner.UID != 1337 || cfg.tree.XDS.SocketOwner.GID != 1337 ||
		cfg.tree.SDS.SocketOwner.UID != 1337 || cfg.tree.SDS.SocketOwner.GID != 1337 {
		t.Fatalf("Envoy as %+v; XDS socket %d:%d, SDS socket %d:%d; want all 1337", cfg.tree.Envoy.RunAs,
			cfg.tree.XDS.SocketOwner.UID, cfg.tree.XDS.SocketOwner.GID, cfg.tree.SDS.SocketOwner.UID, cfg.tree.SDS.SocketOwner.GID)
	}
	if cfg.tree.Capture != nil {
		t.Fatal("ISTIO_CUSTOM_IP_TABLES=true (noCapture) still has a capture service")
	}
}
