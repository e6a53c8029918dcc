package e2e

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// These tests run the real binary, as a user or kubelet would.

func TestAgentServesTreeAndStopsOnSIGTERM(t *testing.T) {
	p := e2ekit.StartAgent(t, nil, "--chaos")
	p.WaitStatus(t, "/healthz/ready", 200)
	body := p.WaitStatus(t, "/debug/tree", 200)
	if !strings.Contains(body, "status") || !strings.Contains(body, "meshagent (ready)") {
		t.Fatalf("/debug/tree:\n%s", body)
	}
	if code, _ := p.Get("/stats/prometheus"); code != 200 {
		t.Fatalf("/stats/prometheus = %d", code)
	}
	if log := p.StopWith(t, syscall.SIGTERM); !strings.Contains(log, "shutting down") {
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
	p := e2ekit.StartAgent(t, []string{"NOTIFY_SOCKET=" + sock})
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
			_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	if code := p.WaitExit(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// Chaos endpoints exist only when asked for, and only for loopback callers.
func TestChaosIsOptIn(t *testing.T) {
	p := e2ekit.StartAgent(t, nil)
	p.WaitStatus(t, "/healthz/ready", 200)
	if code, _ := p.Post(t, "/debug/chaos/kill?service=status"); code != http.StatusNotFound {
		t.Fatalf("chaos kill without --chaos = %d, want 404", code)
	}
}

// As PID 1 (a container without an init) the agent runs under a minimal
// init that forwards signals and passes the exit status through: the small
// meshagent-init beside it, or, where there is none, its own binary.
func TestAgentAsPID1(t *testing.T) {
	testkit.RequireRoot(t, "to create a PID namespace", "unshare")
	alone := filepath.Join(t.TempDir(), "meshagent") // no meshagent-init beside this one
	if err := os.Link(e2ekit.AgentBinary, alone); err != nil {
		t.Fatal(err)
	}
	for name, bin := range map[string]string{"with meshagent-init": e2ekit.AgentBinary, "alone": alone} {
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
	port := e2ekit.FreePort(t)
	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", e2ekit.AgentBinary, "proxy", "--root", t.TempDir())
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
	p := &e2ekit.AgentProcess{Cmd: cmd, Base: fmt.Sprintf("http://127.0.0.1:%d", port), Stderr: &stderr}
	p.WaitStatus(t, "/healthz/ready", 200)

	init := e2ekit.ChildPIDs(t, cmd.Process.Pid) // the namespace's PID 1, as the host sees it
	if len(init) != 1 {
		t.Fatalf("unshare children: %v", init)
	}
	pid1 := init[0]
	// PID 1 is the small init, not a second copy of the agent (#24).
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid1)); strings.TrimSpace(string(comm)) != e2ekit.InitBinaryName {
		t.Fatalf("PID 1 is %q, want %s", strings.TrimSpace(string(comm)), e2ekit.InitBinaryName)
	}
	// An orphan in the namespace: sh starts sleep and exits at once.
	if out, err := exec.Command("nsenter", "-t", strconv.Itoa(pid1), "-p", "sh", "-c", "sleep 0.2 & exit 0").CombinedOutput(); err != nil {
		t.Fatalf("nsenter: %v %s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		zombies := 0
		orphans := 0
		for _, c := range e2ekit.ChildPIDs(t, pid1) {
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
