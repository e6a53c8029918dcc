package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
	"github.com/miekg/dns"
)

// An agent restarted while its control plane is down turns ready with DNS
// capture on: the last-known-good cache serves Envoy, and the name table
// kept with it serves DNS (issue #21: readiness stayed 503 on "dns:
// starting (DNS lookup table is not ready yet)" for the whole outage).
func TestAgentRestartDuringOutageTurnsReadyWithDNS(t *testing.T) {
	cp := e2ekit.StartControlPlane(t)
	if err := cp.SetNameTable(xdsserver.NameTable(map[string]string{"reviews.e2e.svc.cluster.local": "10.0.0.7"})); err != nil {
		t.Fatal(err)
	}
	// A short root: the agent's unix socket paths are limited to 107 bytes.
	root := testkit.ShortTempDir(t, "outage")
	if out, err := exec.Command(e2ekit.DevcertsBinary, "-out", filepath.Join(root, "etc/certs"), "-namespace", "e2e").CombinedOutput(); err != nil {
		t.Fatalf("devcerts: %v\n%s", err, out)
	}
	resolv := filepath.Join(root, "resolv.conf")
	testkit.WriteFile(t, resolv, []byte("nameserver 127.0.0.1\noptions port:1\nsearch e2e.svc.cluster.local svc.cluster.local cluster.local\n"))
	ports := e2ekit.FreePorts(t, 5)
	dnsAddr := fmt.Sprintf("127.0.0.1:%d", ports[4])
	agent := func() *e2ekit.AgentProcess {
		cmd := exec.Command(e2ekit.AgentBinary, "proxy", "--root", root, "--resolv-conf", resolv)
		cmd.Env = append(os.Environ(),
			fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"binaryPath":%q,"terminationDrainDuration":"1s",`+
				`"discoveryAddress":%q,"controlPlaneAuthPolicy":"NONE"}`, ports[0], ports[1], e2ekit.EnvoyBinary, cp.Addr()),
			fmt.Sprintf("ENVOY_STATUS_PORT=%d", ports[2]), fmt.Sprintf("ENVOY_PROMETHEUS_PORT=%d", ports[3]),
			"ISTIO_META_DNS_CAPTURE=true", "DNS_PROXY_ADDR="+dnsAddr,
			"POD_NAME=app-0", "POD_NAMESPACE=e2e", "INSTANCE_IP=127.0.0.1", "SERVICE_ACCOUNT=default")
		p := &e2ekit.AgentProcess{Cmd: cmd, Base: fmt.Sprintf("http://127.0.0.1:%d", ports[0]), Stderr: &testkit.LogBuffer{},
			Exited: make(chan error, 1), Root: root, AdminPort: ports[1], EnvoyStatusPort: ports[2], PromPort: ports[3]}
		p.Start(t)
		return p
	}
	askReviews := func() string {
		m := new(dns.Msg)
		m.SetQuestion("reviews.e2e.svc.cluster.local.", dns.TypeA)
		resp, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, dnsAddr)
		if err != nil || len(resp.Answer) != 1 {
			return fmt.Sprint(resp, err)
		}
		if a, ok := resp.Answer[0].(*dns.A); ok {
			return a.A.String()
		}
		return resp.Answer[0].String()
	}

	first := agent()
	first.WaitStatus(t, "/healthz/ready", 200)
	if got := askReviews(); got != "10.0.0.7" {
		t.Fatalf("DNS with the control plane up: %s, want 10.0.0.7", got)
	}
	first.StopWith(t, syscall.SIGTERM)

	cp.Stop()
	second := agent()
	second.WaitStatus(t, "/healthz/ready", 200)
	if got := askReviews(); got != "10.0.0.7" {
		t.Fatalf("DNS during the outage: %s, want 10.0.0.7 from the cached table", got)
	}
	// Waited for: the agent logs both before it turns ready, but its
	// stderr reaches the test through exec's copying goroutine, which may
	// not have run yet (read once, they were missed with that copy 50 ms
	// late).
	for _, want := range []string{"published the cached DNS name table", "serving cached configuration to Envoy"} {
		second.Stderr.WaitLine(t, want)
	}
}
