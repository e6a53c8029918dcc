package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// What the agent checks at start (#21): a bad value, a busy port, a second
// agent on the root, a missing file or binary is a configuration error —
// exit 2 at once, naming the variable, flag, file or port and the value —
// never a run that fails later for a reason it does not name.

// startBareAgent runs `meshagent proxy` on root with no certificate
// provider and the stand-in Envoy, every port free, then env and args:
// what it takes to get as far as the start checks, and to run past them.
func startBareAgent(t *testing.T, root string, env []string, args ...string) *e2ekit.AgentProcess {
	t.Helper()
	ports := e2ekit.FreePorts(t, 4)
	status, admin, envoyStatus, prom := ports[0], ports[1], ports[2], ports[3]
	cmd := exec.Command(e2ekit.AgentBinary, append([]string{"proxy", "--root", root}, args...)...)
	cmd.Env = append(os.Environ(), append([]string{
		fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"binaryPath":%q,"terminationDrainDuration":"0s"}`,
			status, admin, e2ekit.EnvoyBinary),
		fmt.Sprintf("ENVOY_STATUS_PORT=%d", envoyStatus),
		fmt.Sprintf("ENVOY_PROMETHEUS_PORT=%d", prom),
		"PILOT_CERT_PROVIDER=none", "POD_NAME=app-0", "POD_NAMESPACE=e2e", "INSTANCE_IP=127.0.0.1",
	}, env...)...)
	p := &e2ekit.AgentProcess{Cmd: cmd, Base: fmt.Sprintf("http://127.0.0.1:%d", status), Stderr: &testkit.LogBuffer{},
		Exited: make(chan error, 1), Root: root, AdminPort: admin, EnvoyStatusPort: envoyStatus, PromPort: prom}
	p.Start(t)
	return p
}

// configError runs the agent and wants it to stop at once with exit 2, no
// Envoy started, and every one of want in its message; it returns the log.
func configError(t *testing.T, env []string, args []string, want ...string) string {
	t.Helper()
	p := startBareAgent(t, t.TempDir(), env, args...)
	code := p.WaitExit(t)
	log := p.Stderr.String()
	if code != 2 || len(p.EnvoyPIDs()) > 0 {
		t.Fatalf("env %q args %q: exit %d with %d Envoy starts, want exit 2 before any start; log:\n%s", short(env), args, code, len(p.EnvoyPIDs()), e2ekit.Tail(log, 20))
	}
	testkit.Contains(t, "the error", log, want...)
	return log
}

// short shows env with long values cut, for failure messages.
func short(env []string) []string {
	out := make([]string, len(env))
	for i, kv := range env {
		if len(kv) > 80 {
			kv = kv[:80] + "…"
		}
		out[i] = kv
	}
	return out
}

func TestBadIdentityAndBootstrapVariablesAreConfigurationErrors(t *testing.T) {
	long := strings.Repeat("a", 100*1024)
	for _, c := range []struct {
		env  string
		want []string
	}{
		{"ECC_SIGNATURE_ALGORITHM=ecdsa", []string{`ECC_SIGNATURE_ALGORITHM="ecdsa"`, "ECDSA"}},
		{"ECC_CURVE=P521", []string{`ECC_CURVE="P521"`, "P256 or P384"}},
		{"TRUST_DOMAIN=exämple.org", []string{`TRUST_DOMAIN="exämple.org"`, "trust domain"}},
		{"POD_NAMESPACE=Prod", []string{`POD_NAMESPACE="Prod"`, "DNS-1123 label"}},
		{"SERVICE_ACCOUNT=" + long, []string{`SERVICE_ACCOUNT="aaaa`, "(102400 bytes)", "DNS-1123 subdomain"}},
		{"TRUST_DOMAIN=" + long, []string{`TRUST_DOMAIN="aaaa`, "(102400 bytes)"}},
		{"ISTIO_BOOTSTRAP=/nonexistent/bootstrap.json", []string{`ISTIO_BOOTSTRAP="/nonexistent/bootstrap.json"`, "no such file"}},
	} {
		log := configError(t, []string{c.env}, nil, c.want...)
		if len(log) > 4096 {
			t.Errorf("%.40s…: a %d-byte error; a long value must be cut", c.env, len(log))
		}
	}
}

func TestEnvoyBinaryIsCheckedAtStart(t *testing.T) {
	notExec := filepath.Join(t.TempDir(), "envoy")
	testkit.WriteFile(t, notExec, []byte("#!/bin/sh\n"))
	for _, c := range []struct {
		binary string
		want   string
	}{
		{"/nonexistent/envoy", "does not exist"},
		{notExec, "is not executable"},
	} {
		pc := fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"binaryPath":%q}`, e2ekit.FreePort(t), c.binary)
		configError(t, []string{pc}, nil, "binaryPath", strconv.Quote(c.binary), c.want, "DISABLE_ENVOY")
	}
	// Without Envoy (proxyless gRPC) the binary is not needed.
	port := e2ekit.FreePort(t)
	p := startBareAgent(t, t.TempDir(), []string{"DISABLE_ENVOY=true",
		fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"binaryPath":"/nonexistent/envoy"}`, port)})
	p.Base = fmt.Sprintf("http://127.0.0.1:%d", port)
	p.WaitStatus(t, "/healthz/ready", 200)
}

// Istio's default mesh config file may be missing (then Istio's defaults
// apply); a file named with --meshConfig must exist.
func TestExplicitMeshConfigMustExist(t *testing.T) {
	configError(t, nil, []string{"--meshConfig", "/nonexistent/mesh"}, `--meshConfig "/nonexistent/mesh"`, "does not exist")
}

// A second agent on the root of a running one is told so, with the first
// one's PID, instead of taking the first one's SDS socket for an external
// SDS server.
func TestSecondAgentOnTheSameRootIsRefused(t *testing.T) {
	first := startBareAgent(t, t.TempDir(), []string{"DISABLE_ENVOY=true"})
	first.WaitStatus(t, "/healthz/ready", 200)
	second := startBareAgent(t, first.Root, []string{"DISABLE_ENVOY=true"})
	if code := second.WaitExit(t); code != 2 {
		t.Fatalf("second agent on the root: exit %d, want 2; log:\n%s", code, second.Stderr.String())
	}
	testkit.Contains(t, "the second agent's error", second.Stderr.String(), "another agent runs on this root",
		fmt.Sprintf("pid %d", first.Cmd.Process.Pid), filepath.Join(first.Root, config.ConfigPathDir, config.RootLockFile))
	first.WaitStatus(t, "/healthz/ready", 200) // undisturbed
	// The lock goes with its agent: the next one on the root starts.
	first.StopWith(t, syscall.SIGTERM)
	third := startBareAgent(t, first.Root, []string{"DISABLE_ENVOY=true"})
	third.WaitStatus(t, "/healthz/ready", 200)
}

// A port the agent or its Envoy would bind, held by another process, is
// named at start with the process holding it (here: this test).
func TestBusyPortIsNamedWithItsHolder(t *testing.T) {
	holder := fmt.Sprintf("pid %d", os.Getpid())
	t.Run("status", func(t *testing.T) {
		ln := listenTCP(t, "")
		pc := fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"binaryPath":%q}`, ln, e2ekit.EnvoyBinary)
		configError(t, []string{pc}, nil, fmt.Sprintf(":%d/tcp", ln), "status server (ProxyConfig statusPort)", "in use", holder)
	})
	t.Run("envoy admin", func(t *testing.T) {
		ln := listenTCP(t, "127.0.0.1")
		pc := fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"binaryPath":%q}`, e2ekit.FreePort(t), ln, e2ekit.EnvoyBinary)
		configError(t, []string{pc}, nil, fmt.Sprintf("127.0.0.1:%d/tcp", ln), "Envoy's admin API (ProxyConfig proxyAdminPort)", holder)
	})
	t.Run("envoy readiness", func(t *testing.T) {
		ln := listenTCP(t, "127.0.0.1") // on one address: Envoy's wildcard listener cannot bind it either
		configError(t, []string{fmt.Sprintf("ENVOY_STATUS_PORT=%d", ln)}, nil, fmt.Sprintf("0.0.0.0:%d/tcp", ln), "ENVOY_STATUS_PORT", holder)
	})
	t.Run("dns", func(t *testing.T) {
		conn, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		addr := conn.LocalAddr().String()
		configError(t, []string{"ISTIO_META_DNS_CAPTURE=true", "DNS_PROXY_ADDR=" + addr}, nil, addr+"/udp", "DNS proxy (DNS_PROXY_ADDR)", holder)
	})
}

// listenTCP listens on a free port of host ("" is every address) until the
// test ends, and returns the port.
func listenTCP(t *testing.T, host string) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// SIGHUP (systemd's `reload`) is logged and ignored: the agent stays up and
// ready, with the same Envoy.
func TestSIGHUPIsLoggedAndIgnored(t *testing.T) {
	p := e2ekit.StartAgent(t, nil)
	p.WaitStatus(t, "/healthz/ready", 200)
	before := p.EnvoyPIDs()
	if len(before) != 1 {
		t.Fatalf("Envoy starts before SIGHUP: %v", before)
	}
	for n := 1; n <= 2; n++ { // one at a time: the kernel merges pending signals
		if err := p.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		p.WaitLog(t, fmt.Sprintf("SIGHUP log line %d", n), func(log string) bool {
			return strings.Count(log, "SIGHUP: nothing to reload; ignored") == n
		})
	}
	p.WaitStatus(t, "/healthz/ready", 200)
	after := p.EnvoyPIDs()
	if len(after) != 1 || after[0] != before[0] || !alive(before[0]) {
		t.Fatalf("Envoy after SIGHUP: %v, want the same pid %d alive", after, before[0])
	}
	if log := p.Stderr.String(); strings.Contains(log, "draining") {
		t.Fatalf("SIGHUP started a drain:\n%s", log)
	}
	// SIGHUP did not count as a first stop signal: one SIGTERM drains.
	p.StopWith(t, syscall.SIGTERM)
}
