package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/miekg/dns"
)

// The DNS proxy in the whole agent: fed by --name-table, readiness waits
// for the table, answers come from it, and a chaos kill heals.
func TestAgentDNSFromNameTable(t *testing.T) {
	dir := t.TempDir()
	table := filepath.Join(dir, "names.json")
	testkit.WriteFile(t, table, []byte(`{"table": {"reviews.e2e.svc.cluster.local": {"ips": ["10.0.0.7"], "registry": "Kubernetes", "shortname": "reviews", "namespace": "e2e"}}}`))
	resolv := filepath.Join(dir, "resolv.conf")
	testkit.WriteFile(t, resolv, []byte("nameserver 127.0.0.1\noptions port:1\nsearch e2e.svc.cluster.local svc.cluster.local cluster.local\n"))
	dnsAddr := fmt.Sprintf("127.0.0.1:%d", e2ekit.FreePort(t))
	p := e2ekit.StartAgent(t, []string{"DNS_PROXY_ADDR=" + dnsAddr}, "--name-table", table, "--resolv-conf", resolv, "--chaos")
	p.WaitStatus(t, "/healthz/ready", 200)

	ask := func(name string) ([]string, error) {
		c := &dns.Client{Timeout: 2 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		r, _, err := c.Exchange(m, dnsAddr)
		if err != nil {
			return nil, err
		}
		var ips []string
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				ips = append(ips, a.A.String())
			}
		}
		return ips, nil
	}
	for _, name := range []string{"reviews.e2e.svc.cluster.local", "reviews", "reviews.e2e"} {
		ips, err := ask(name)
		if err != nil || len(ips) != 1 || ips[0] != "10.0.0.7" {
			t.Fatalf("%s: %v %v, want 10.0.0.7", name, ips, err)
		}
	}

	// /debug/ndsz shows the table with the names the proxy generated.
	if code, body := p.Get("/debug/ndsz"); code != 200 || !strings.Contains(body, "reviews.e2e.svc.cluster.local") || !strings.Contains(body, "10.0.0.7") {
		t.Fatalf("/debug/ndsz = %d %s", code, body)
	}

	// A new table file is picked up without a restart.
	testkit.WriteFile(t, table, []byte(`{"table": {"reviews.e2e.svc.cluster.local": {"ips": ["10.0.0.8"], "registry": "Kubernetes", "shortname": "reviews", "namespace": "e2e"}}}`))
	testkit.WaitFor(t, "the table reloaded", func() bool { ips, _ := ask("reviews"); return len(ips) == 1 && ips[0] == "10.0.0.8" })

	// Kill the DNS proxy: the tree restarts it and it answers again.
	if code, _ := e2ekit.PostTo(p.Base + "/debug/chaos/kill?service=dns"); code != 200 {
		t.Fatalf("chaos kill = %d", code)
	}
	p.WaitLog(t, "dns restart", func(log string) bool { return strings.Contains(log, `msg="service failed; restarting" service=dns`) })
	testkit.WaitFor(t, "the DNS proxy back after the kill", func() bool {
		ips, _ := ask("reviews.e2e.svc.cluster.local")
		return len(ips) == 1 && ips[0] == "10.0.0.8"
	})
	p.WaitStatus(t, "/healthz/ready", 200)
}
