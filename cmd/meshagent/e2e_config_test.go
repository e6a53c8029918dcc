package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The configuration as a user sees it: flags, variables and the version,
// on the real binary.

// `proxy --someUnknownFlag` runs, as Istio's pilot-agent does, and says
// which flag it ignored.
func TestUnknownFlagIsIgnoredWithAWarning(t *testing.T) {
	p := startAgent(t, nil, "--someUnknownFlag")
	p.waitStatus(t, "/healthz/ready", 200)
	log := p.stderr.String()
	if !strings.Contains(log, "ignoring unknown flags") || !strings.Contains(log, "--someUnknownFlag") {
		t.Fatalf("no warning naming --someUnknownFlag:\n%s", log)
	}
}

// Envoy's readiness listener is on ENVOY_STATUS_PORT (startAgent picks a
// free one) and forwards to the agent: kubelet's probe works on it.
func TestEnvoyStatusPortServesReadiness(t *testing.T) {
	p := startAgent(t, nil)
	p.waitStatus(t, "/healthz/ready", 200)
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", p.envoyStatusPort)
	resp, err := httpClient().Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d, want 200 through Envoy's listener", url, resp.StatusCode)
	}
}

// POST /drain (Istio's preStop for native sidecars) drains and keeps Envoy
// running: Istio adds skip_exit to the query.
func TestPostDrainAddsSkipExit(t *testing.T) {
	p := startAgent(t, nil)
	p.waitStatus(t, "/healthz/ready", 200)
	resp, err := http.Post(p.base+"/drain", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var drains []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		p.adminJSON(t, "/fake/drains", &drains)
		if len(drains) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !slices.Equal(drains, []string{"inboundonly&graceful&skip_exit"}) {
		t.Fatalf("Envoy saw drains %q, want [inboundonly&graceful&skip_exit]", drains)
	}
}

// A gateway (`proxy router`) drains every listener on SIGTERM, not only
// the inbound ones.
func TestGatewayDrainsEveryListener(t *testing.T) {
	p := startAgent(t, nil, "router")
	p.waitStatus(t, "/healthz/ready", 200)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.waitExit(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	log := p.stderr.String()
	if !strings.Contains(log, "drain_listeners?graceful\n") || strings.Contains(log, "inboundonly") {
		t.Fatalf("the gateway's Envoy did not see exactly drain_listeners?graceful:\n%s", log)
	}
}

// adminJSON decodes the answer of Envoy's admin API at path.
func (p *agentProcess) adminJSON(t *testing.T, path string, v any) {
	t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d%s", p.adminPort, path)
	resp, err := httpClient().Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
