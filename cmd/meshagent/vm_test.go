package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// A bad cluster.env line stops the agent before anything starts: exit 2,
// naming file:line. A missing cluster.env names the path it looked at.
func TestVMRefusesABadOrMissingClusterEnv(t *testing.T) {
	root := t.TempDir()
	code, _, stderr := runCLI("vm", "--root", root)
	if want := config.Rooted(root, clusterEnvFile); code != 2 || !strings.Contains(stderr, want+" does not exist") {
		t.Fatalf("missing cluster.env: exit %d, stderr %q; want 2 naming %s", code, stderr, want)
	}
	testkit.WriteFile(t, config.Rooted(root, clusterEnvFile), []byte("ISTIO_NAMESPACE='vm-ns'\nISTIO_SERVICE_CIDR=$CIDR\n"))
	code, _, stderr = runCLI("vm", "--root", root)
	if want := config.Rooted(root, clusterEnvFile) + ":2:"; code != 2 || !strings.Contains(stderr, want) {
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
	text := strings.ReplaceAll(string(unit), "/usr/local/bin/meshagent", e2ekit.AgentBinary)
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
// Istio's script runs it (config.TestEnvoyRunAsOwnsTheSockets: Envoy's
// sockets are chowned to it).
func TestVMProxyUserIsTheOneTheRulesExempt(t *testing.T) {
	host := config.Host{Env: config.MapEnvironment(nil), LookupUID: func(string) (string, error) { return "", errors.New("no such user") }}
	u, err := vmProxyUser(host)
	if err != nil || u.UID != 1337 || u.GID != 1337 || u.envoy == nil || *u.envoy != (envoy.Credential{UID: 1337, GID: 1337}) {
		t.Fatalf("no istio-proxy user: %+v, %v; want 1337:1337", u, err)
	}
	host.LookupUID = func(name string) (string, error) {
		if name == "istio-proxy" {
			return "998", nil
		}
		return "", errors.New("no such user")
	}
	if u, err = vmProxyUser(host); err != nil || u.UID != 998 || u.GID != 998 {
		t.Fatalf("istio-proxy is uid 998: %+v, %v", u, err)
	}
	host.Env = config.MapEnvironment(map[string]string{"ISTIO_INBOUND_INTERCEPTION_MODE": "TPROXY"})
	if u, err = vmProxyUser(host); err != nil || u.envoy != nil || u.envoyUID() != 0 {
		t.Fatalf("TPROXY: %+v, %v; want Envoy as root", u, err)
	}

}

// A VM's files where Istio's bundle puts them, under --root: the defaults
// of ISTIO_CLUSTER_CONFIG and ISTIO_SIDECAR_CONFIG (`meshagent help env`).
const (
	clusterEnvFile = "./var/lib/istio/envoy/cluster.env"
	sidecarEnvFile = "./var/lib/istio/envoy/sidecar.env"
)
