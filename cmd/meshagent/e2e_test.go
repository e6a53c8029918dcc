package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// These tests run the real binary, as a user or kubelet would.

// e2eVersion is the version the agent under test is built with, the way
// `make build` sets it.
const e2eVersion = "1.99.0-e2e"

// The binaries the end-to-end tests run: the agent, the Envoy it starts
// (the stand-in, or MESHAGENT_TEST_ENVOY), and the dev certificate writer.
var agentBinary, envoyBinary, devcertsBinary string

// e2eBinDirEnv names the directory of those binaries to a re-run of the
// test binary, which then builds nothing.
const e2eBinDirEnv = "MESHAGENT_E2E_BINDIR"

func TestMain(m *testing.M) {
	if addr := os.Getenv(xdsHelperEnv); addr != "" {
		os.Exit(runXDSHelper(addr))
	}
	if spec := os.Getenv(caHelperEnv); spec != "" {
		os.Exit(runCAHelper(spec))
	}
	if slices.ContainsFunc(os.Args, func(a string) bool {
		return strings.HasPrefix(a, "-test.fuzz=") || strings.HasPrefix(a, "-test.fuzzworker") || strings.HasPrefix(a, "-test.list=")
	}) {
		// `go test -fuzz` (its coordinator and a worker per CPU) and `go
		// test -list` (hack/fuzz.sh) run no end-to-end test: no binaries.
		os.Exit(m.Run())
	}
	if os.Getenv("MESHAGENT_IPTABLES_HELPER") == "1" {
		// The test binary re-run as a CLI child (iptables_test.go): it
		// needs no binaries built.
		os.Exit(m.Run())
	}
	if dir := os.Getenv(e2eBinDirEnv); dir != "" {
		// The test binary re-run inside a namespace by a test of the
		// parent run (e2e_istiod_test.go): the parent's binaries serve.
		agentBinary, envoyBinary, devcertsBinary = filepath.Join(dir, "meshagent"), filepath.Join(dir, "fakeenvoy"), filepath.Join(dir, "devcerts")
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "meshagent-e2e")
	if err != nil {
		panic(err)
	}
	agentBinary = filepath.Join(dir, "meshagent")
	envoyBinary = filepath.Join(dir, "fakeenvoy")
	devcertsBinary = filepath.Join(dir, "devcerts")
	initBinary := filepath.Join(dir, leanInit) // beside the agent, as `make build` and the image put it
	for bin, pkg := range map[string]string{agentBinary: ".", initBinary: "../meshagent-init", envoyBinary: "../../testdata/fakeenvoy", devcertsBinary: "../../testdata/devcerts"} {
		build := exec.Command("go", "build", "-o", bin, pkg)
		if bin == agentBinary { // as `make build` does
			build.Args = []string{"go", "build", "-ldflags", "-X main.buildVersion=" + e2eVersion, "-o", bin, pkg}
		}
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n", pkg, err)
			os.Exit(1)
		}
	}
	if real := os.Getenv("MESHAGENT_TEST_ENVOY"); real != "" {
		envoyBinary = real
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freePort(t *testing.T) int {
	t.Helper()
	return freePorts(t, 1)[0]
}

// freePorts are n distinct free ports: each listener stays open until all
// are chosen, so that one agent never gets the same port twice.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// agentProcess is a running `meshagent proxy`.
type agentProcess struct {
	cmd    *exec.Cmd
	base   string
	stderr *testkit.LogBuffer
	exited chan error
	// root is its --root; adminPort, envoyStatusPort and
	// envoyPrometheusPort are the ports its Envoy was given.
	root                                 string
	adminPort, envoyStatusPort, promPort int
}

// startAgent runs `meshagent proxy` as a pod would: file-mounted dev
// certificates under its root, Envoy (the stand-in) as its child, every
// port free and chosen here.
func startAgent(t *testing.T, env []string, args ...string) *agentProcess {
	t.Helper()
	return startAgentDrain(t, "1s", env, args...)
}

// startAgentDrain is startAgent with ProxyConfig terminationDrainDuration.
func startAgentDrain(t *testing.T, drain string, env []string, args ...string) *agentProcess {
	t.Helper()
	return startAgentOpts(t, "", drain, env, args...)
}

// startAgentIn is startAgent inside the named network namespace.
func startAgentIn(t *testing.T, netns string, env []string, args ...string) *agentProcess {
	t.Helper()
	return startAgentOpts(t, netns, "1s", env, args...)
}

func startAgentOpts(t *testing.T, netns, drain string, env []string, args ...string) *agentProcess {
	t.Helper()
	return startAgentWith(t, agentOptions{netns: netns, drain: drain}, env, args...)
}

// agentOptions are how startAgentWith departs from startAgent's pod.
type agentOptions struct {
	// netns runs the agent (and its plaintext control plane) inside this
	// network namespace.
	netns string
	// drain is ProxyConfig's terminationDrainDuration (default 1s).
	drain string
	// controlPlane, when set, is the agent's control plane, reached over
	// TLS (MUTUAL_TLS) and verified with the file-mounted root-cert.pem;
	// otherwise a plaintext one is started.
	controlPlane *xdsserver.Server
	// certs, when set, writes the file-mounted certificates into the
	// directory it is given, instead of devcerts.
	certs func(dir string)
}

func startAgentWith(t *testing.T, o agentOptions, env []string, args ...string) *agentProcess {
	t.Helper()
	root := t.TempDir()
	if o.drain == "" {
		o.drain = "1s"
	}
	if o.certs != nil {
		o.certs(filepath.Join(root, "etc/certs"))
	} else if out, err := exec.Command(devcertsBinary, "-out", filepath.Join(root, "etc/certs"), "-namespace", "e2e").CombinedOutput(); err != nil {
		t.Fatalf("devcerts: %v\n%s", err, out)
	}
	ports := freePorts(t, 5)
	port, adminPort, statusPort, promPort := ports[0], ports[1], ports[2], ports[3]
	cmd := exec.Command(agentBinary, append([]string{"proxy", "--root", root}, args...)...)
	var discovery string
	auth := "NONE"
	switch {
	case o.controlPlane != nil:
		discovery, auth = o.controlPlane.Addr(), "MUTUAL_TLS"
	case o.netns != "":
		discovery = fmt.Sprintf("127.0.0.1:%d", ports[4])
		startControlPlaneIn(t, o.netns, discovery)
	default:
		discovery = startControlPlane(t).Addr()
	}
	if o.netns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", o.netns, agentBinary, "proxy", "--root", root}, args...)...)
	}
	cmd.Env = append(os.Environ(), append([]string{
		fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"binaryPath":%q,"terminationDrainDuration":%q,`+
			`"discoveryAddress":%q,"controlPlaneAuthPolicy":%q}`,
			port, adminPort, envoyBinary, o.drain, discovery, auth),
		fmt.Sprintf("ENVOY_STATUS_PORT=%d", statusPort),
		fmt.Sprintf("ENVOY_PROMETHEUS_PORT=%d", promPort),
		"POD_NAME=app-0", "POD_NAMESPACE=e2e", "INSTANCE_IP=127.0.0.1", "SERVICE_ACCOUNT=default",
	}, env...)...)
	p := &agentProcess{cmd: cmd, base: fmt.Sprintf("http://127.0.0.1:%d", port), stderr: &testkit.LogBuffer{}, exited: make(chan error, 1),
		root: root, adminPort: adminPort, envoyStatusPort: statusPort, promPort: promPort}
	p.start(t)
	return p
}

// start starts p.cmd, its stderr kept in p.stderr, killed at the end of
// the test (its log printed if the test failed).
func (p *agentProcess) start(t *testing.T) {
	t.Helper()
	cmd := p.cmd
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("agent log:\n%s", p.stderr.String())
		}
	})
}

// get is the status server's answer at path; status 0 when it did not
// answer.
func (p *agentProcess) get(path string) (int, string) {
	return testkit.Fetch(http.MethodGet, p.base+path)
}

// post is the status server's answer to a POST at path: it must answer.
func (p *agentProcess) post(t *testing.T, path string) (int, string) {
	t.Helper()
	return testkit.MustFetch(t, http.MethodPost, p.base+path)
}

func (p *agentProcess) waitStatus(t *testing.T, path string, code int) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, body := p.get(path)
		if got == code {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: last %d %q, want %d", path, got, body, code)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *agentProcess) waitExit(t *testing.T) int {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
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
func (p *agentProcess) stopWith(t *testing.T, sig syscall.Signal) string {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if code := p.waitExit(t); code != 0 {
		t.Fatalf("exit code after %v = %d, want 0", sig, code)
	}
	return p.stderr.String()
}

func TestAgentServesTreeAndStopsOnSIGTERM(t *testing.T) {
	p := startAgent(t, nil, "--chaos")
	p.waitStatus(t, "/healthz/ready", 200)
	body := p.waitStatus(t, "/debug/tree", 200)
	if !strings.Contains(body, "status") || !strings.Contains(body, "meshagent (ready)") {
		t.Fatalf("/debug/tree:\n%s", body)
	}
	if code, _ := p.get("/stats/prometheus"); code != 200 {
		t.Fatalf("/stats/prometheus = %d", code)
	}
	if log := p.stopWith(t, syscall.SIGTERM); !strings.Contains(log, "shutting down") {
		t.Fatalf("no shutdown log:\n%s", log)
	}
}

// A process supervised by systemd (Type=notify) sees READY=1 then STOPPING=1.
func TestAgentSdNotify(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	p := startAgent(t, []string{"NOTIFY_SOCKET=" + sock})
	want := []string{"READY=1", "STOPPING=1"}
	for i, w := range want {
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 128)
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %s: %v", w, err)
		}
		if got := string(buf[:n]); got != w {
			t.Fatalf("notification %d = %q, want %q", i, got, w)
		}
		if i == 0 {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	if code := p.waitExit(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// Chaos endpoints exist only when asked for, and only for loopback callers.
func TestChaosIsOptIn(t *testing.T) {
	p := startAgent(t, nil)
	p.waitStatus(t, "/healthz/ready", 200)
	if code, _ := p.post(t, "/debug/chaos/kill?service=status"); code != http.StatusNotFound {
		t.Fatalf("chaos kill without --chaos = %d, want 404", code)
	}
}

// As PID 1 (a container without an init) the agent runs under a minimal
// init that forwards signals and passes the exit status through: the small
// meshagent-init beside it, or, where there is none, its own binary.
func TestAgentAsPID1(t *testing.T) {
	testkit.RequireRoot(t, "to create a PID namespace", "unshare")
	alone := filepath.Join(t.TempDir(), "meshagent") // no meshagent-init beside this one
	if err := os.Link(agentBinary, alone); err != nil {
		t.Fatal(err)
	}
	for name, bin := range map[string]string{"with meshagent-init": agentBinary, "alone": alone} {
		out, err := exec.Command("unshare", "--pid", "--fork", "--mount-proc", bin, "version", "-s").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) == "" {
			t.Fatalf("%s: version as PID 1: %v %q", name, err, out)
		}
		cmd := exec.Command("unshare", "--pid", "--fork", "--mount-proc", bin, "proxy", "--concurrency", "x")
		err = cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Fatalf("%s: proxy --concurrency x as PID 1: %v, want exit 2", name, err)
		}
	}
}

// As PID 1 the agent reaps the orphans of its PID namespace, and SIGTERM
// to PID 1 reaches the agent, which drains and exits 0.
func TestAgentAsPID1ReapsOrphans(t *testing.T) {
	testkit.RequireRoot(t, "to create a PID namespace", "unshare", "nsenter")
	port := freePort(t)
	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", agentBinary, "proxy", "--root", t.TempDir())
	cmd.Env = append(os.Environ(), fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d}`, port),
		"DISABLE_ENVOY=true", "PILOT_CERT_PROVIDER=none")
	var stderr testkit.LogBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-done
	}()
	p := &agentProcess{cmd: cmd, base: fmt.Sprintf("http://127.0.0.1:%d", port), stderr: &stderr}
	p.waitStatus(t, "/healthz/ready", 200)

	init := childPIDs(t, cmd.Process.Pid) // the namespace's PID 1, as the host sees it
	if len(init) != 1 {
		t.Fatalf("unshare children: %v", init)
	}
	pid1 := init[0]
	// PID 1 is the small init, not a second copy of the agent (#24).
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid1)); strings.TrimSpace(string(comm)) != leanInit {
		t.Fatalf("PID 1 is %q, want %s", strings.TrimSpace(string(comm)), leanInit)
	}
	// An orphan in the namespace: sh starts sleep and exits at once.
	if out, err := exec.Command("nsenter", "-t", strconv.Itoa(pid1), "-p", "sh", "-c", "sleep 0.2 & exit 0").CombinedOutput(); err != nil {
		t.Fatalf("nsenter: %v %s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		zombies := 0
		orphans := 0
		for _, c := range childPIDs(t, pid1) {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c))
			if strings.TrimSpace(string(comm)) == "sleep" {
				orphans++
				if testkit.IsZombie(c) {
					zombies++
				}
			}
		}
		if orphans == 0 {
			break // reparented to PID 1 and reaped
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan not reaped: %d sleep children of PID 1, %d zombies", orphans, zombies)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := syscall.Kill(pid1, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("unshare/agent exit: %v\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent as PID 1 did not stop on SIGTERM")
	}
	if !strings.Contains(stderr.String(), "meshagent stopped") {
		t.Fatalf("SIGTERM did not reach the agent:\n%s", stderr.String())
	}
}

// childPIDs are pid's children, from /proc.
func childPIDs(t *testing.T, pid int) []int {
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

func httpClient() *http.Client { return &http.Client{Timeout: 10 * time.Second} }
