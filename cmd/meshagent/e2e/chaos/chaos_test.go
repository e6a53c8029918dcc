package chaos

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// TestAgentChaos is an operator's chaos test on the real binary: over and
// over, kill a random part of a running agent — a service through
// /debug/chaos/kill, or the Envoy process with SIGKILL — and check that the
// agent heals every time: all services back, readiness 200. `make chaos`
// runs the long form (MESHAGENT_CHAOS_LONG=1).
func TestAgentChaos(t *testing.T) {
	rounds := testkit.ChaosRounds(8, 200, 8)
	dir := t.TempDir()
	table := filepath.Join(dir, "names.json")
	testkit.WriteFile(t, table, []byte(`{"table": {"reviews.e2e.svc.cluster.local": {"ips": ["10.0.0.7"]}}}`))
	resolv := filepath.Join(dir, "resolv.conf")
	testkit.WriteFile(t, resolv, []byte("nameserver 127.0.0.1\noptions port:1\n"))
	p := e2ekit.StartAgent(t, []string{fmt.Sprintf("DNS_PROXY_ADDR=127.0.0.1:%d", e2ekit.FreePort(t))},
		"--name-table", table, "--resolv-conf", resolv, "--chaos", "--envoy-restarts", "1000",
		// Kills every moment would grow the backoff to its 30s cap.
		"--restart-max-delay", "500ms")
	p.WaitStatus(t, "/healthz/ready", 200)

	certs := e2ekit.WatchSDSCertificates(t, filepath.Join(p.Root, "var/run/secrets/workload-spiffe-uds/socket"))
	latest := e2ekit.NextCertificate(t, certs, "certificate")

	targets := []string{"certs", "sds", "dns", "nametable", "names", "envoy", "status", "identity", "xds", "envoy-process", "cert-files"}
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	killed := map[string]int{}
	deadline := time.Now().Add(8 * time.Minute)
	for round := 0; round < rounds && time.Now().Before(deadline); round++ {
		waitHealed(t, p)
		victim := targets[rng.IntN(len(targets))]
		killed[victim]++
		if victim == "cert-files" {
			latest = replaceCertFiles(t, p, certs, latest)
			continue
		}
		service := victim
		if victim == "envoy-process" {
			service = "envoy"
		}
		before := restarts(t, p, service)
		if victim == "envoy-process" {
			pids := p.EnvoyPIDs()
			latest := -1
			for epoch := range pids {
				latest = max(latest, epoch)
			}
			if err := syscall.Kill(pids[latest], syscall.SIGKILL); err != nil {
				t.Fatalf("round %d: kill envoy %d: %v", round, pids[latest], err)
			}
		} else if code, err := e2ekit.PostTo(p.Base + "/debug/chaos/kill?service=" + victim); err != nil || code != 200 {
			t.Fatalf("round %d: kill %s = %d %v", round, victim, code, err)
		}
		// The kill has landed once the tree counted the restart.
		deadline := time.Now().Add(60 * time.Second)
		for restarts(t, p, service) <= before {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %s was never restarted", round, victim)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitHealed(t, p)
	t.Logf("agent chaos: %d rounds, kills: %v", rounds, killed)
}

// restarts reads meshagent_service_restarts_total{service} from the agent
// (retrying while the status server itself restarts).
func restarts(t *testing.T, p *e2ekit.AgentProcess, service string) float64 {
	t.Helper()
	want := fmt.Sprintf(`istio_agent_meshagent_service_restarts_total{service=%q} `, service)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if code, body := p.Get("/stats/prometheus"); code == 200 {
			for _, line := range strings.Split(body, "\n") {
				if v, ok := strings.CutPrefix(line, want); ok {
					f, _ := strconv.ParseFloat(v, 64)
					return f
				}
			}
			return 0
		}
		if time.Now().After(deadline) {
			t.Fatal("status server unreachable")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitHealed waits until every node of the tree is up and the agent is
// ready. The status server itself may be among the killed, so errors are
// retried.
func waitHealed(t *testing.T, p *e2ekit.AgentProcess) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if code, body := p.Get("/debug/tree?format=json"); code == 200 {
			var tree struct {
				Ready    bool                   `json:"ready"`
				Services []messages.ServiceInfo `json:"services"`
			}
			if json.Unmarshal([]byte(body), &tree) == nil && tree.Ready && allUp(tree.Services) {
				return
			}
		}
		if time.Now().After(deadline) {
			_, body := p.Get("/debug/tree")
			t.Fatalf("agent did not heal:\n%s", body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func allUp(services []messages.ServiceInfo) bool {
	for _, s := range services {
		switch s.StateName {
		case "ready", "running", "degraded, done", "ready, done":
		default:
			return false
		}
	}
	return len(services) > 0
}

// replaceCertFiles replaces the file-mounted certificates with a corrupt
// set, then with a good new one: the corrupt set is never served (the agent
// keeps the last good certificate and stays ready), and the new one reaches
// the SDS client. It returns the certificate the client holds.
func replaceCertFiles(t *testing.T, p *e2ekit.AgentProcess, certs <-chan *x509.Certificate, latest *x509.Certificate) *x509.Certificate {
	t.Helper()
	dir := filepath.Join(p.Root, "etc/certs")
	for _, f := range []string{"cert-chain.pem", "key.pem"} {
		testkit.WriteFile(t, filepath.Join(dir, f), []byte("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n"))
	}
	// Past the file debounce (100 ms): nothing new is pushed, and the agent
	// stays ready on the last good certificate.
	select {
	case c := <-certs:
		t.Fatalf("a certificate (serial %x) was pushed after the files were corrupted", c.SerialNumber)
	case <-time.After(500 * time.Millisecond):
	}
	if code, body := p.Get("/healthz/ready"); code != 200 {
		t.Fatalf("with corrupt certificate files: ready = %d %s, want 200 on the last good certificate", code, body)
	}
	fresh := t.TempDir()
	if out, err := exec.Command(e2ekit.DevcertsBinary, "-out", fresh, "-namespace", "e2e").CombinedOutput(); err != nil {
		t.Fatalf("devcerts: %v\n%s", err, out)
	}
	for _, f := range []string{"root-cert.pem", "key.pem", "cert-chain.pem"} {
		b, err := os.ReadFile(filepath.Join(fresh, f))
		if err != nil {
			t.Fatal(err)
		}
		testkit.WriteFile(t, filepath.Join(dir, f), []byte(string(b)))
	}
	want := e2ekit.ReadCertificate(t, filepath.Join(dir, "cert-chain.pem"))
	for {
		got := e2ekit.NextCertificate(t, certs, "the good certificate after the corrupt set")
		if got.SerialNumber.Cmp(want.SerialNumber) == 0 {
			return got
		}
		if got.SerialNumber.Cmp(latest.SerialNumber) != 0 {
			t.Fatalf("SDS pushed serial %x, neither the last good (%x) nor the new one (%x)", got.SerialNumber, latest.SerialNumber, want.SerialNumber)
		}
	}
}
