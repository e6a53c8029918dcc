package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/services/envoy/bootstrap"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/envoyadmin"
)

// The kubelet's readiness probe on Envoy's 15021 (#36): Envoy answers it
// itself while the agent has told it the agent is ready, and forwards it
// to the agent otherwise, so that the agent's reasons reach the kubelet.

// probe15021 is the answer of Envoy's readiness listener, with a short
// timeout: a probe forwarded to a stopped agent cannot be answered.
func probe15021(p *e2ekit.AgentProcess) (int, string) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", p.EnvoyStatusPort))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(body)
}

// agentReadyKey is Envoy's runtime value of meshagent.agent_ready ("" when
// it has none), and whether Envoy's admin API answered.
func agentReadyKey(p *e2ekit.AgentProcess) (string, bool) {
	code, body := testkit.Fetch(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/runtime", p.AdminPort))
	if code != http.StatusOK {
		return "", false
	}
	v, err := envoyadmin.RuntimeValue([]byte(body), bootstrap.ReadinessKey)
	return v, err == nil
}

// answersMetricIs says whether the agent's metrics say, as want ("1" or
// "0"), that Envoy answers the kubelet's probe itself.
func answersMetricIs(p *e2ekit.AgentProcess, want string) func() bool {
	return func() bool {
		_, metrics := p.Get("/stats/prometheus")
		return strings.Contains(metrics, "\nistio_agent_envoy_answers_readiness_probe "+want+"\n")
	}
}

// envoyNoteSays says whether the envoy service's own reason on /debug/tree
// (the JSON view's health_reason, the text view's REASON column) says that
// Envoy answers the kubelet's probe itself, as want.
func envoyNoteSays(p *e2ekit.AgentProcess, want bool) func() bool {
	return func() bool {
		code, body := p.Get("/debug/tree?format=json")
		var tree struct {
			Services []struct {
				Name         string `json:"name"`
				HealthReason string `json:"health_reason"`
			} `json:"services"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &tree) != nil {
			return false
		}
		for _, s := range tree.Services {
			if s.Name == "envoy" {
				return strings.Contains(s.HealthReason, "envoy answers the kubelet's readiness probe itself") == want
			}
		}
		return false
	}
}

// keyIs says whether Envoy answers and its meshagent.agent_ready is want.
func keyIs(p *e2ekit.AgentProcess, want string) func() bool {
	return func() bool { v, ok := agentReadyKey(p); return ok && v == want }
}

func TestEnvoyAnswersReadinessOnTheAgentsWord(t *testing.T) {
	p := e2ekit.StartAgentDrain(t, "4s", nil)
	p.WaitStatus(t, "/healthz/ready", 200)
	testkit.WaitFor(t, "the agent tells envoy it is ready", keyIs(p, "100"))
	testkit.WaitFor(t, "the agent's metrics say envoy answers the probe", answersMetricIs(p, "1"))
	testkit.WaitFor(t, "the envoy line of /debug/tree says envoy answers the probe", envoyNoteSays(p, true))

	// Envoy answers with the agent stopped: a forwarded probe could not be.
	resume := stopAgent(t, p)
	code, body := probe15021(p)
	resume()
	if code != http.StatusOK {
		t.Fatalf("15021 with the agent stopped: %d %s, want 200 from Envoy itself", code, body)
	}

	// A new Envoy starts without the key: until the agent says so again,
	// the probes go to the agent, which answers for itself.
	first := p.EnvoyPIDs()[0]
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "a new envoy", func() bool { return p.EnvoyPIDs()[1] != 0 })
	p.WaitStatus(t, "/healthz/ready", 200)
	testkit.WaitFor(t, "the agent tells the new envoy it is ready", keyIs(p, "100"))

	// Draining, the agent is not ready and takes the probes back: the
	// kubelet reads its reason.
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var body503 string
	testkit.WaitFor(t, "15021 answers 503 while draining", func() bool {
		c, b := probe15021(p)
		body503 = b
		return c == http.StatusServiceUnavailable
	})
	if !strings.Contains(body503, "not ready") {
		t.Fatalf("15021's 503 while draining: %q, want the agent's reason", body503)
	}
	if v, ok := agentReadyKey(p); !ok || v != "0" {
		t.Fatalf("envoy's meshagent.agent_ready while draining = %q (admin answered: %v), want 0", v, ok)
	}
	testkit.WaitFor(t, "the agent's metrics say the probe goes to the agent", answersMetricIs(p, "0"))
	if !envoyNoteSays(p, false)() {
		t.Error("the envoy line of /debug/tree still says envoy answers the probe while draining")
	}
	if code := p.WaitExit(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d", code)
	}
}

// MESHAGENT_ENVOY_ANSWERS_READINESS=false: Istio's route alone, every probe
// forwarded to the agent.
func TestEnvoyAnswersReadinessOff(t *testing.T) {
	p := e2ekit.StartAgent(t, []string{"MESHAGENT_ENVOY_ANSWERS_READINESS=false"})
	p.WaitStatus(t, "/healthz/ready", 200)
	if code, body := probe15021(p); code != http.StatusOK {
		t.Fatalf("15021: %d %s, want 200 forwarded from the agent", code, body)
	}
	if v, ok := agentReadyKey(p); !ok || v != "" {
		t.Fatalf("envoy's meshagent.agent_ready = %q (admin answered: %v), want none", v, ok)
	}
	if !answersMetricIs(p, "0")() {
		t.Error("the agent's metrics say envoy answers the probe; the bootstrap has no such route")
	}
	if !envoyNoteSays(p, false)() {
		t.Error("the envoy line of /debug/tree says envoy answers the probe; the bootstrap has no such route")
	}
	resume := stopAgent(t, p)
	code, _ := probe15021(p)
	resume()
	if code == http.StatusOK {
		t.Fatal("15021 answered 200 with the agent stopped: the probe was not forwarded")
	}
}

// stopAgent stops the agent (SIGSTOP) and returns once every thread of it
// is stopped (testkit.IsStopped): under make test's load the agent answered
// a forwarded probe after the signal (TestEnvoyAnswersReadinessOff, #36's
// fifth session). The returned func lets it run again.
func stopAgent(t *testing.T, p *e2ekit.AgentProcess) (resume func()) {
	t.Helper()
	pid := p.Cmd.Process.Pid
	if err := p.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resume = func() {
		if err := p.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Error(err)
		}
	}
	testkit.WaitFor(t, "every thread of the agent stopped", func() bool { return testkit.IsStopped(pid) })
	return resume
}
