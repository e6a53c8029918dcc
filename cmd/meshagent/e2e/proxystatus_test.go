package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// proxy-status on a running `meshagent standalone` with the stand-in Envoy
// (issue 22): a pushed cluster the stand-in rejects shows NACKED with its
// error naming the cluster; a later push it takes is SYNCED again; with the
// control plane down and Envoy restarted, SERVING CACHE; SYNCED once the
// control plane is back.
func TestProxyStatusVerdictsOnTheStandIn(t *testing.T) {
	t.Setenv("FAKE_ENVOY_REJECT_NAME", "rejected-svc") // the agent passes its environment to Envoy
	mesh, sample := sampleMesh(t)
	p := e2ekit.StartStandalone(t, mesh, "")
	p.WaitStatus(t, "/healthz/ready", 200)

	status := func() string {
		out, err := exec.Command(e2ekit.AgentBinary, "proxy-status", "--addr", strings.TrimPrefix(p.Base, "http://")).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("proxy-status: %v: %s", err, out)
		}
		return string(out)
	}
	cdsRow := func(verdict string) func() bool {
		return func() bool {
			for _, l := range strings.Split(status(), "\n") {
				if f := strings.Fields(l); len(f) > 1 && f[0] == "cds" {
					return strings.HasPrefix(strings.Join(f[1:], " "), verdict)
				}
			}
			return false
		}
	}
	e2ekit.WaitUntil(t, "cds SYNCED", cdsRow("SYNCED"), status)

	// A service whose cluster the stand-in rejects, as Envoy rejects a
	// cluster it cannot load.
	testkit.WriteFile(t, mesh, []byte(strings.Replace(string(sample), "\nexternalNames:", `
  - name: rejected-svc
    namespace: default
    vip: 10.96.0.99
    ports:
      - port: 9080
        protocol: http
        endpoints: []
`+"\nexternalNames:", 1)))
	e2ekit.WaitUntil(t, "cds NACKED", cdsRow("NACKED"), status)
	rejected := "outbound|9080||rejected-svc.default.svc.cluster.local"
	if out := status(); !strings.Contains(out, rejected) || !strings.Contains(out, "rejected by FAKE_ENVOY_REJECT_NAME") {
		t.Errorf("proxy-status does not show Envoy's error naming %s:\n%s", rejected, out)
	}
	testkit.WriteFile(t, mesh, []byte(string(sample)))
	e2ekit.WaitUntil(t, "cds SYNCED after a push Envoy takes", cdsRow("SYNCED"), status)

	// The control plane held down, Envoy restarted: it is served the cache.
	if code, body := p.Post(t, "/debug/chaos/kill?service=controlplane&for=8s"); code != 200 {
		t.Fatalf("chaos kill: %d %s", code, body)
	}
	pids := p.EnvoyPIDs()
	if err := syscall.Kill(pids[len(pids)-1], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e2ekit.WaitUntil(t, "cds SERVING CACHE", cdsRow("SERVING CACHE"), status)
	e2ekit.WaitUntil(t, "cds SYNCED once the control plane is back", cdsRow("SYNCED"), status)
}
