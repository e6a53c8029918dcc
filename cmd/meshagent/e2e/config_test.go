package e2e

import (
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// The configuration as a user sees it: flags, variables and the version,
// on the real binary.

// `proxy --someUnknownFlag` runs, as Istio's pilot-agent does, and says
// which flag it ignored.
func TestUnknownFlagIsIgnoredWithAWarning(t *testing.T) {
	p := e2ekit.StartAgent(t, nil, "--someUnknownFlag")
	p.WaitStatus(t, "/healthz/ready", 200)
	log := p.Stderr.String()
	if !strings.Contains(log, "ignoring unknown flags") || !strings.Contains(log, "--someUnknownFlag") {
		t.Fatalf("no warning naming --someUnknownFlag:\n%s", log)
	}
}

// Envoy's readiness listener is on ENVOY_STATUS_PORT (startAgent picks a
// free one) and forwards to the agent: kubelet's probe works on it.
func TestEnvoyStatusPortServesReadiness(t *testing.T) {
	p := e2ekit.StartAgent(t, nil)
	p.WaitStatus(t, "/healthz/ready", 200)
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", p.EnvoyStatusPort)
	resp, err := e2ekit.HTTPClient().Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d, want 200 through Envoy's listener", url, resp.StatusCode)
	}
}

// The version the binary is built with (`make build` passes it with
// -ldflags) is what `version` prints and what Envoy's node metadata says.
func TestVersionComesFromTheBuild(t *testing.T) {
	out, err := exec.Command(e2ekit.AgentBinary, "version", "-s").Output()
	if err != nil || strings.TrimSpace(string(out)) != e2ekit.E2EVersion {
		t.Fatalf("version -s = %q, %v; want %s", out, err, e2ekit.E2EVersion)
	}
	p := e2ekit.StartAgent(t, nil)
	p.WaitStatus(t, "/healthz/ready", 200)
	var info struct {
		Node struct {
			Metadata map[string]any `json:"metadata"`
		} `json:"node"`
	}
	p.AdminJSON(t, "/server_info", &info)
	if got := info.Node.Metadata["ISTIO_VERSION"]; got != e2ekit.E2EVersion {
		t.Fatalf("node metadata ISTIO_VERSION = %v, want %s", got, e2ekit.E2EVersion)
	}
}

// POST /drain (Istio's preStop for native sidecars) drains and keeps Envoy
// running: Istio adds skip_exit to the query.
func TestPostDrainAddsSkipExit(t *testing.T) {
	p := e2ekit.StartAgent(t, nil)
	p.WaitStatus(t, "/healthz/ready", 200)
	p.Post(t, "/drain")
	var drains []string
	testkit.WaitFor(t, "Envoy to see a drain", func() bool { p.AdminJSON(t, "/fake/drains", &drains); return len(drains) > 0 })
	if !slices.Equal(drains, []string{"inboundonly&graceful&skip_exit"}) {
		t.Fatalf("Envoy saw drains %q, want [inboundonly&graceful&skip_exit]", drains)
	}
}

// A gateway (`proxy router`) drains every listener on SIGTERM, not only
// the inbound ones.
func TestGatewayDrainsEveryListener(t *testing.T) {
	p := e2ekit.StartAgent(t, nil, "router")
	p.WaitStatus(t, "/healthz/ready", 200)
	log := p.StopWith(t, syscall.SIGTERM)
	if !strings.Contains(log, "drain_listeners?graceful\n") || strings.Contains(log, "inboundonly") {
		t.Fatalf("the gateway's Envoy did not see exactly drain_listeners?graceful:\n%s", log)
	}
}

// `make build` stamps the version from git (the e2e binary above is built
// the same way): a Makefile build never says "dev".
func TestMakeBuildStampsTheVersion(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("needs make")
	}
	cmd := exec.Command("make", "-n", "build")
	cmd.Dir = "../../.." // the repository
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, out)
	}
	_, after, ok := strings.Cut(string(out), "-X main.buildVersion=")
	version, _, _ := strings.Cut(after, " ")
	if !ok || version == "" || version == "dev" || strings.ContainsAny(version, "'\"$") {
		t.Fatalf("make build does not stamp a version: %s", out)
	}
}
