// Package e2ekit is the harness the tests of the built agent share (#26):
// the end-to-end suite (cmd/meshagent/e2e), the chaos suites
// (cmd/meshagent/e2e/chaos), the conformance suite
// (cmd/meshagent/conformance) and the commands' own tests. Main builds the
// agent, the stand-in Envoy and the dev certificate writer once per test
// binary; the rest starts agents (proxy, standalone, under a namespace),
// control planes and CAs, and reads what they do. The built binaries are
// its interface: it needs none of the commands' internals.
package e2ekit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// E2EVersion is the version the agent under test is built with, the way
// `make build` sets it.
const E2EVersion = "1.99.0-e2e"

// InitBinaryName is the small init the image ships beside the agent
// (cmd/meshagent-init; cmd/meshagent's reaper.go runs it as PID 1).
const InitBinaryName = "meshagent-init"

// The binaries the end-to-end tests run: the agent, the Envoy it starts
// (the stand-in, or MESHAGENT_TEST_ENVOY), and the dev certificate writer.
var AgentBinary, EnvoyBinary, DevcertsBinary string

// E2EBinDirEnv names the directory of those binaries to a re-run of the
// test binary, which then builds nothing.
const E2EBinDirEnv = "MESHAGENT_E2E_BINDIR"

func FreePort(t *testing.T) int {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreePorts are n distinct free ports (testkit.FreePorts), so that one
// agent never gets the same port twice.
func FreePorts(t *testing.T, n int) []int {
	t.Helper()
	ports, err := testkit.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// AgentProcess is a running `meshagent proxy`.
type AgentProcess struct {
	Cmd    *exec.Cmd
	Base   string
	Stderr *testkit.LogBuffer
	Exited chan error
	// root is its --root; adminPort, envoyStatusPort and
	// envoyPrometheusPort are the ports its Envoy was given.
	Root                                 string
	AdminPort, EnvoyStatusPort, PromPort int
}

// StartAgent runs `meshagent proxy` as a pod would: file-mounted dev
// certificates under its root, Envoy (the stand-in) as its child, every
// port free and chosen here.
func StartAgent(t *testing.T, env []string, args ...string) *AgentProcess {
	t.Helper()
	return StartAgentDrain(t, "1s", env, args...)
}

// StartAgentDrain is startAgent with ProxyConfig terminationDrainDuration.
func StartAgentDrain(t *testing.T, drain string, env []string, args ...string) *AgentProcess {
	t.Helper()
	return StartAgentOpts(t, "", drain, env, args...)
}

// StartAgentIn is startAgent inside the named network namespace.
func StartAgentIn(t *testing.T, netns string, env []string, args ...string) *AgentProcess {
	t.Helper()
	return StartAgentOpts(t, netns, "1s", env, args...)
}

func StartAgentOpts(t *testing.T, netns, drain string, env []string, args ...string) *AgentProcess {
	t.Helper()
	return StartAgentWith(t, AgentOptions{Netns: netns, Drain: drain}, env, args...)
}

// AgentOptions are how startAgentWith departs from startAgent's pod.
type AgentOptions struct {
	// netns runs the agent (and its plaintext control plane) inside this
	// network namespace.
	Netns string
	// drain is ProxyConfig's terminationDrainDuration (default 1s).
	Drain string
	// controlPlane, when set, is the agent's control plane, reached over
	// TLS (MUTUAL_TLS) and verified with the file-mounted root-cert.pem;
	// otherwise a plaintext one is started.
	ControlPlane *xdsserver.Server
	// certs, when set, writes the file-mounted certificates into the
	// directory it is given, instead of devcerts.
	Certs func(dir string)
}

func StartAgentWith(t *testing.T, o AgentOptions, env []string, args ...string) *AgentProcess {
	t.Helper()
	root := t.TempDir()
	if o.Drain == "" {
		o.Drain = "1s"
	}
	if o.Certs != nil {
		o.Certs(filepath.Join(root, "etc/certs"))
	} else if out, err := exec.Command(DevcertsBinary, "-out", filepath.Join(root, "etc/certs"), "-namespace", "e2e").CombinedOutput(); err != nil {
		t.Fatalf("devcerts: %v\n%s", err, out)
	}
	ports := FreePorts(t, 5)
	port, adminPort, statusPort, promPort := ports[0], ports[1], ports[2], ports[3]
	cmd := exec.Command(AgentBinary, append([]string{"proxy", "--root", root}, args...)...)
	var discovery string
	auth := "NONE"
	switch {
	case o.ControlPlane != nil:
		discovery, auth = o.ControlPlane.Addr(), "MUTUAL_TLS"
	case o.Netns != "":
		discovery = fmt.Sprintf("127.0.0.1:%d", ports[4])
		StartControlPlaneIn(t, o.Netns, discovery)
	default:
		discovery = StartControlPlane(t).Addr()
	}
	if o.Netns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", o.Netns, AgentBinary, "proxy", "--root", root}, args...)...)
	}
	cmd.Env = append(os.Environ(), append([]string{
		fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"binaryPath":%q,"terminationDrainDuration":%q,`+
			`"discoveryAddress":%q,"controlPlaneAuthPolicy":%q}`,
			port, adminPort, EnvoyBinary, o.Drain, discovery, auth),
		fmt.Sprintf("ENVOY_STATUS_PORT=%d", statusPort),
		fmt.Sprintf("ENVOY_PROMETHEUS_PORT=%d", promPort),
		"POD_NAME=app-0", "POD_NAMESPACE=e2e", "INSTANCE_IP=127.0.0.1", "SERVICE_ACCOUNT=default",
	}, env...)...)
	p := &AgentProcess{Cmd: cmd, Base: fmt.Sprintf("http://127.0.0.1:%d", port), Stderr: &testkit.LogBuffer{}, Exited: make(chan error, 1),
		Root: root, AdminPort: adminPort, EnvoyStatusPort: statusPort, PromPort: promPort}
	p.Start(t)
	return p
}

// Start starts p.cmd, its stderr kept in p.stderr, killed at the end of
// the test (its log printed if the test failed).
func (p *AgentProcess) Start(t *testing.T) {
	t.Helper()
	cmd := p.Cmd
	cmd.Stderr = p.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.Exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.Exited
		if t.Failed() {
			t.Logf("agent log:\n%s", p.Stderr.String())
		}
	})
}

// Get is the status server's answer at path; status 0 when it did not
// answer.
func (p *AgentProcess) Get(path string) (int, string) {
	return testkit.Fetch(http.MethodGet, p.Base+path)
}

// Post is the status server's answer to a POST at path: it must answer.
func (p *AgentProcess) Post(t *testing.T, path string) (int, string) {
	t.Helper()
	return testkit.MustFetch(t, http.MethodPost, p.Base+path)
}

func (p *AgentProcess) WaitStatus(t *testing.T, path string, code int) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, body := p.Get(path)
		if got == code {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: last %d %q, want %d", path, got, body, code)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *AgentProcess) WaitExit(t *testing.T) int {
	t.Helper()
	select {
	case err := <-p.Exited:
		p.Exited <- err
		if err == nil {
			return 0
		}
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		t.Fatalf("agent wait: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("agent did not exit")
	}
	return -1
}

// stopWith sends sig to the agent, which must then exit with status 0,
// and returns the agent's log.
func (p *AgentProcess) StopWith(t *testing.T, sig syscall.Signal) string {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if code := p.WaitExit(t); code != 0 {
		t.Fatalf("exit code after %v = %d, want 0", sig, code)
	}
	return p.Stderr.String()
}

// ChildPIDs are pid's children, from /proc.
func ChildPIDs(t *testing.T, pid int) []int {
	t.Helper()
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, field := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(field); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

func HTTPClient() *http.Client { return &http.Client{Timeout: 10 * time.Second} }

// adminJSON decodes the answer of Envoy's admin API at path.
func (p *AgentProcess) AdminJSON(t *testing.T, path string, v any) {
	t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d%s", p.AdminPort, path)
	resp, err := HTTPClient().Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// envoyPIDs are the Envoy children the agent has logged, by epoch.
func (p *AgentProcess) EnvoyPIDs() map[int]int {
	out := map[int]int{}
	for _, m := range EnvoyStarted.FindAllStringSubmatch(p.Stderr.String(), -1) {
		pid, _ := strconv.Atoi(m[1])
		epoch, _ := strconv.Atoi(m[2])
		out[epoch] = pid
	}
	return out
}

func (p *AgentProcess) WaitLog(t *testing.T, what string, cond func(log string) bool) {
	t.Helper()
	testkit.WaitFor(t, what, func() bool { return cond(p.Stderr.String()) })
}

// Main is the TestMain of every package that runs the built binaries (the
// end-to-end, chaos and conformance suites, cmd/meshagent's own tests): it
// builds the agent, the stand-in Envoy and the dev certificate writer once
// per test binary, or, when the test binary is re-run as a helper (a
// control plane, a CA, a CLI child, a run inside a namespace), serves as
// that helper.
func Main(m *testing.M) {
	const module = "github.com/meshagent/meshagent"
	if addr := os.Getenv(XDSHelperEnv); addr != "" {
		os.Exit(RunXDSHelper(addr))
	}
	if spec := os.Getenv(CAHelperEnv); spec != "" {
		os.Exit(RunCAHelper(spec))
	}
	if slices.ContainsFunc(os.Args, func(a string) bool {
		return strings.HasPrefix(a, "-test.fuzz=") || strings.HasPrefix(a, "-test.fuzzworker") || strings.HasPrefix(a, "-test.list=")
	}) {
		// `go test -fuzz` (its coordinator and a worker per CPU) and `go
		// test -list` (hack/fuzz.sh) run no end-to-end test: no binaries.
		os.Exit(m.Run())
	}
	if os.Getenv("MESHAGENT_IPTABLES_HELPER") == "1" {
		// The test binary re-run as a CLI child (cmd/meshagent/iptables_test.go): it
		// needs no binaries built.
		os.Exit(m.Run())
	}
	if dir := os.Getenv(E2EBinDirEnv); dir != "" {
		// The test binary re-run inside a namespace by a test of the
		// parent run (cmd/meshagent/e2e/istiod_test.go): the parent's binaries serve.
		AgentBinary, EnvoyBinary, DevcertsBinary = filepath.Join(dir, "meshagent"), filepath.Join(dir, "fakeenvoy"), filepath.Join(dir, "devcerts")
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "meshagent-e2e")
	if err != nil {
		panic(err)
	}
	AgentBinary = filepath.Join(dir, "meshagent")
	EnvoyBinary = filepath.Join(dir, "fakeenvoy")
	DevcertsBinary = filepath.Join(dir, "devcerts")
	initBinary := filepath.Join(dir, InitBinaryName) // beside the agent, as `make build` and the image put it
	for bin, pkg := range map[string]string{AgentBinary: module + "/cmd/meshagent", initBinary: module + "/cmd/meshagent-init",
		EnvoyBinary: module + "/testdata/fakeenvoy", DevcertsBinary: module + "/testdata/devcerts"} {
		build := exec.Command("go", "build", "-o", bin, pkg)
		if bin == AgentBinary { // as `make build` does
			build.Args = []string{"go", "build", "-ldflags", "-X main.buildVersion=" + E2EVersion, "-o", bin, pkg}
		}
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n", pkg, err)
			os.Exit(1)
		}
	}
	if real := os.Getenv("MESHAGENT_TEST_ENVOY"); real != "" {
		EnvoyBinary = real
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// EnvoyStarted is the agent's log line for each Envoy it starts: its pid
// and epoch.
var EnvoyStarted = regexp.MustCompile(`msg="envoy started" service=envoy pid=(\d+) epoch=(\d+)`)

// PostTo POSTs an empty body to url and returns the status code.
func PostTo(url string) (int, error) {
	resp, err := HTTPClient().Post(url, "text/plain", nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Tail is the last lines of s, for a failure's message.
func Tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
