package e2e

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

// Envoy killed → the agent publishes it not ready, starts a new Envoy (new
// pid, next epoch) and is ready again; DNS/SDS/status never stopped.
func TestEnvoyKilledIsRestarted(t *testing.T) {
	// Each Envoy takes a moment to become ready, so the 503 is observable.
	p := e2ekit.StartAgent(t, []string{"FAKE_ENVOY_READY_AFTER=700ms"})
	p.WaitStatus(t, "/healthz/ready", 200)
	first := p.EnvoyPIDs()[0]
	if first == 0 {
		t.Fatalf("no envoy start logged:\n%s", p.Stderr.String())
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	body := p.WaitStatus(t, "/healthz/ready", 503)
	if !strings.Contains(body, "envoy") {
		t.Fatalf("503 body does not name envoy: %q", body)
	}
	p.WaitStatus(t, "/healthz/ready", 200)
	second := p.EnvoyPIDs()[1]
	if second == 0 || second == first || !alive(second) {
		t.Fatalf("after the kill: pids by epoch %v", p.EnvoyPIDs())
	}
	tree := p.WaitStatus(t, "/debug/tree", 200)
	if !regexp.MustCompile(`envoy\s+\S+\s+1\s`).MatchString(tree) || !strings.Contains(tree, "signal: killed") {
		t.Fatalf("/debug/tree does not show the restart:\n%s", tree)
	}
	if _, metrics := p.Get("/stats/prometheus"); !strings.Contains(metrics, `istio_agent_meshagent_service_restarts_total{service="envoy"} 1`) {
		t.Fatalf("restart not counted:\n%s", metrics)
	}
}

// An Envoy that keeps crashing makes the agent give up: non-zero exit, and
// the message names Envoy's last exit.
func TestEnvoyCrashLoopGivesUp(t *testing.T) {
	p := e2ekit.StartAgent(t, []string{"FAKE_ENVOY_CRASH_AFTER=10ms"}, "--envoy-restarts", "2")
	code := p.WaitExit(t)
	log := p.Stderr.String()
	if code == 0 || !strings.Contains(log, "envoy failed 3 times") || !strings.Contains(log, "exit status 1") {
		t.Fatalf("exit %d; log:\n%s", code, log)
	}
	if n := len(p.EnvoyPIDs()); n != 3 {
		t.Fatalf("%d Envoy starts, want 3 (2 restarts)", n)
	}
}

// --envoy-restarts=0 is Istio's behaviour: the agent leaves with Envoy's
// exit status when Envoy exits.
func TestEnvoyRestartsZeroIsIstiosBehaviour(t *testing.T) {
	p := e2ekit.StartAgent(t, []string{"FAKE_ENVOY_CRASH_AFTER=200ms", "FAKE_ENVOY_EXIT_CODE=3"}, "--envoy-restarts", "0")
	if code := p.WaitExit(t); code != 3 {
		t.Fatalf("exit %d, want Envoy's 3; log:\n%s", code, p.Stderr.String())
	}
}

// SIGTERM drains Envoy the way Istio's agent does, then exits 0.
func TestSIGTERMDrainsEnvoy(t *testing.T) {
	p := e2ekit.StartAgent(t, nil)
	p.WaitStatus(t, "/healthz/ready", 200)
	envoyPID := p.EnvoyPIDs()[0]
	log := p.StopWith(t, syscall.SIGTERM)
	drain := regexp.MustCompile(`drain_listeners\?(\S+)`).FindStringSubmatch(log)
	if drain == nil || !strings.Contains(drain[1], "inboundonly") || !strings.Contains(drain[1], "graceful") {
		t.Fatalf("Envoy did not see drain_listeners?inboundonly&graceful:\n%s", log)
	}
	// The drain came before Envoy was stopped, and Envoy is gone.
	if strings.Index(log, "drain_listeners") > strings.Index(log, `msg="stopping envoy"`) {
		t.Fatalf("Envoy stopped before it was drained:\n%s", log)
	}
	if alive(envoyPID) {
		t.Fatalf("Envoy %d still running after the agent exited", envoyPID)
	}
}

// With EXIT_ON_ZERO_ACTIVE_CONNECTIONS the agent leaves as soon as Envoy's
// active connections reach zero, not after the whole drain duration.
func TestDrainEndsAtZeroActiveConnections(t *testing.T) {
	p := e2ekit.StartAgentDrain(t, "60s", []string{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true", "MINIMUM_DRAIN_DURATION=10ms",
		"FAKE_ENVOY_ACTIVE_CONNECTIONS=3", "FAKE_ENVOY_DRAIN_SECONDS=2"})
	p.WaitStatus(t, "/healthz/ready", 200)
	log := p.StopWith(t, syscall.SIGTERM)
	if !strings.Contains(log, "waiting for active connections to end") || !strings.Contains(log, "no more active connections") {
		t.Fatalf("the drain did not follow active connections:\n%s", log)
	}
	if strings.Contains(log, "termination drain duration over") {
		t.Fatalf("the drain waited for the whole duration:\n%s", log)
	}
}

// Killing the agent with SIGKILL leaves no Envoy behind (Pdeathsig).
func TestAgentSIGKILLLeavesNoEnvoy(t *testing.T) {
	p := e2ekit.StartAgent(t, nil)
	p.WaitStatus(t, "/healthz/ready", 200)
	envoyPID := p.EnvoyPIDs()[0]
	if !alive(envoyPID) {
		t.Fatalf("envoy %d not running", envoyPID)
	}
	_ = p.Cmd.Process.Kill()
	p.WaitExit(t)
	deadline := time.Now().Add(30 * time.Second)
	for alive(envoyPID) && time.Now().Before(deadline) {
		// A killed child stays a zombie until its new parent reaps it;
		// /proc says whether it still runs.
		if testkit.IsZombie(envoyPID) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	if alive(envoyPID) && !testkit.IsZombie(envoyPID) {
		t.Fatalf("Envoy %d outlived the agent", envoyPID)
	}
}

// A bootstrap that cannot be written (here: a missing override file) is a
// clear error naming the file, on /healthz/ready and in the log, retried
// with growing backoff, and in the end a non-zero exit.
func TestBadBootstrapInputIsReportedWithBackoff(t *testing.T) {
	missing := "/nonexistent/custom_bootstrap.json"
	p := e2ekit.StartAgent(t, []string{"ISTIO_BOOTSTRAP_OVERRIDE=" + missing}, "--envoy-restarts", "3")
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := p.Get("/healthz/ready")
		if code == 503 && strings.Contains(body, missing) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz/ready never named %s: %d %q", missing, code, body)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if code := p.WaitExit(t); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	log := p.Stderr.String()
	delays := regexp.MustCompile(`service=envoy attempt=(\d+) next_delay=(\S+)`).FindAllStringSubmatch(log, -1)
	if len(delays) != 3 {
		t.Fatalf("want 3 restarts with delays, got %v\n%s", delays, log)
	}
	// The first failure restarts at once; from the second the delay grows
	// (jittered doubling: each at least half the ceiling).
	var prev time.Duration
	for i, d := range delays {
		delay, err := time.ParseDuration(d[2])
		ok := (i == 0 && delay == 0) || (i > 0 && delay > prev/2)
		if err != nil || !ok {
			t.Fatalf("want an immediate first restart, then growing delays: %v", delays)
		}
		prev = delay
	}
	if !strings.Contains(log, "giving up") || !strings.Contains(log, missing) {
		t.Fatalf("give-up message does not name the file:\n%s", log)
	}
}

// An Envoy one of whose listeners cannot listen when its workers start
// (its port taken by another socket since Envoy bound it) removes that
// listener and never reports its workers started, though /ready says
// LIVE: the agent stays not ready, with Istio's reason, and the kubelet
// keeps the pod out of service rather than sending it traffic a listener
// cannot take. The stand-in did this only once it stopped being kinder
// than Envoy (#36).
func TestEnvoyListenFailureKeepsAgentUnready(t *testing.T) {
	p := e2ekit.StartAgent(t, []string{"FAKE_ENVOY_READY_AFTER=3s"})
	testkit.WaitFor(t, "envoy's listeners bound", func() bool { return strings.Contains(p.Stderr.String(), "started: admin on") })
	// 15021's socket is bound, not listening: a socket with SO_REUSEADDR
	// (Go sets it) may bind the same address and listen first.
	taker, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", p.EnvoyStatusPort))
	if err != nil {
		t.Fatalf("taking envoy's readiness port before its workers start: %v", err)
	}
	defer taker.Close()
	admin := func(path string) (int, string) {
		return testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d%s", p.AdminPort, path))
	}
	testkit.WaitFor(t, "envoy LIVE", func() bool { code, _ := admin("/ready"); return code == 200 })
	testkit.WaitFor(t, "the agent not ready, with Istio's reason", func() bool {
		code, body := p.Get("/healthz/ready")
		return code == 503 && strings.Contains(body, "workers have not yet started")
	})
	if _, stats := admin("/stats"); !strings.Contains(stats, "listener_manager.listener_create_failure: 1") {
		t.Errorf("envoy's stats do not count the listener it removed:\n%s", stats)
	}
}
