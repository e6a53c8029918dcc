package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
)

// TestAgentChaos is an operator's chaos test on the real binary: over and
// over, kill a random part of a running agent — a service through
// /debug/chaos/kill, or the Envoy process with SIGKILL — and check that the
// agent heals every time: all services back, readiness 200. `make chaos`
// runs the long form (MESHAGENT_CHAOS_LONG=1).
func TestAgentChaos(t *testing.T) {
	rounds := 8
	if os.Getenv("MESHAGENT_CHAOS_LONG") != "" {
		rounds = 200
	}
	dir := t.TempDir()
	table := filepath.Join(dir, "names.json")
	writeFile(t, table, `{"table": {"reviews.e2e.svc.cluster.local": {"ips": ["10.0.0.7"]}}}`)
	resolv := filepath.Join(dir, "resolv.conf")
	writeFile(t, resolv, "nameserver 127.0.0.1\noptions port:1\n")
	p := startAgent(t, []string{fmt.Sprintf("DNS_PROXY_ADDR=127.0.0.1:%d", freePort(t))},
		"--name-table", table, "--resolv-conf", resolv, "--chaos", "--envoy-restarts", "1000",
		// Kills every moment would grow the backoff to its 30s cap.
		"--restart-max-delay", "500ms")
	p.waitStatus(t, "/healthz/ready", 200)

	targets := []string{"certs", "sds", "dns", "nametable", "envoy", "status", "identity", "xds", "envoy-process"}
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	killed := map[string]int{}
	deadline := time.Now().Add(8 * time.Minute)
	for round := 0; round < rounds && time.Now().Before(deadline); round++ {
		waitHealed(t, p)
		victim := targets[rng.IntN(len(targets))]
		killed[victim]++
		service := victim
		if victim == "envoy-process" {
			service = "envoy"
		}
		before := restarts(t, p, service)
		if victim == "envoy-process" {
			pids := p.envoyPIDs()
			latest := -1
			for epoch := range pids {
				latest = max(latest, epoch)
			}
			if err := syscall.Kill(pids[latest], syscall.SIGKILL); err != nil {
				t.Fatalf("round %d: kill envoy %d: %v", round, pids[latest], err)
			}
		} else if code, err := postTo(p.base + "/debug/chaos/kill?service=" + victim); err != nil || code != 200 {
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
func restarts(t *testing.T, p *agentProcess, service string) float64 {
	t.Helper()
	want := fmt.Sprintf(`istio_agent_meshagent_service_restarts_total{service=%q} `, service)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if code, body := p.get("/stats/prometheus"); code == 200 {
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
func waitHealed(t *testing.T, p *agentProcess) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if code, body := p.get("/debug/tree?format=json"); code == 200 {
			var tree struct {
				Ready    bool                   `json:"ready"`
				Services []messages.ServiceInfo `json:"services"`
			}
			if json.Unmarshal([]byte(body), &tree) == nil && tree.Ready && allUp(tree.Services) {
				return
			}
		}
		if time.Now().After(deadline) {
			_, body := p.get("/debug/tree")
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
