package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
	"github.com/miekg/dns"
)

// A trust-root rotation restarts nothing it does not concern (#26). The
// file-mounted root-cert.pem is rewritten several times while a client
// queries the DNS proxy at a steady rate, for a name of the name table and
// for one the proxy forwards to a resolver on loopback: no query is lost
// or fails, the DNS proxy and the name table run on (their /debug/tree
// since unchanged), no service is restarted, and the XDS proxy dials the
// control plane again after each rotation with the new roots: the control
// plane's certificate is reissued by the new root alone, so each new
// stream it sees proves them.
func TestAgentRootRotationLosesNoDNSQuery(t *testing.T) {
	const rotations = 4
	a := startDNSAgent(t, true)
	p, cp := a.p, a.cp
	before := treeNodes(t, p)
	if got := before["dns"].Path; got != "names/dns" {
		t.Errorf("the DNS proxy is at %q in the tree, want names/dns: a group of its own", got)
	}

	load := startDNSLoad(a.DNSAddr, 500, map[string]string{
		"reviews.e2e.svc.cluster.local.": "10.0.0.7",   // from the name table
		"www.upstream.test.":             "192.0.2.77", // forwarded
	})
	defer load.stop()
	time.Sleep(300 * time.Millisecond) // a steady rate before the first rotation
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := 1; i <= rotations; i++ {
		streams := upstreamStreams(cp.Stats())
		next := pki.NewRoot(t, fmt.Sprintf("mesh-root-%d", i))
		a.serverCert.Issue(t, next)
		testkit.ReplaceFile(t, filepath.Join(a.certDir, "root-cert.pem"), next.CertPEM)
		if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return upstreamStreams(s) > streams }); err != nil {
			t.Fatalf("rotation %d: the control plane saw no new stream with the new root: %v", i, err)
		}
		time.Sleep(300 * time.Millisecond) // Envoy reconnected; DNS under load meanwhile
	}
	sent := load.stop()
	t.Logf("%d root rotations under DNS load: %d queries sent, %d lost, %d SERVFAIL, %d wrong answers",
		rotations, sent, load.lost.Load(), load.servfail.Load(), load.wrong.Load())
	if load.lost.Load() != 0 || load.servfail.Load() != 0 || load.wrong.Load() != 0 {
		t.Errorf("DNS queries failed during the rotations: %d lost, %d SERVFAIL, %d wrong of %d (first: %v)",
			load.lost.Load(), load.servfail.Load(), load.wrong.Load(), sent, load.firstErr())
	}
	if got := a.upstream.Queries.Load(); got == 0 {
		t.Error("the upstream resolver answered nothing: the forwarded name was not forwarded")
	}

	after := treeNodes(t, p)
	for _, name := range []string{"dns", "nametable", "names"} {
		if !after[name].Since.Equal(before[name].Since) {
			t.Errorf("%s's run began anew during the rotations: since %v, was %v", name, after[name].Since, before[name].Since)
		}
	}
	for name, b := range before {
		if got := after[name].Restarts; got != b.Restarts {
			t.Errorf("%s was restarted by the rotations: %d restarts, was %d", name, got, b.Restarts)
		}
	}
	if got := strings.Count(p.Stderr.String(), `reason="trust roots changed"`); got != rotations {
		t.Errorf("the XDS proxy logged %d redials for new roots, want %d", got, rotations)
	}
	p.WaitStatus(t, "/healthz/ready", 200)
}

// The other events a running agent lives through lose no DNS query either
// and restart nothing they do not concern (#26): a renewed workload
// certificate, an NDS update, an xDS reconnect (the control plane
// restarts) and an Envoy restart (Envoy killed), each under the same
// steady load. Only the envoy service is restarted, by the last.
func TestAgentEventsLoseNoDNSQuery(t *testing.T) {
	a := startDNSAgent(t, false)
	p, cp := a.p, a.cp
	before := treeNodes(t, p)
	load := startDNSLoad(a.DNSAddr, 500, map[string]string{
		"reviews.e2e.svc.cluster.local.": "10.0.0.7",   // from NDS
		"www.upstream.test.":             "192.0.2.77", // forwarded
	})
	defer load.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	time.Sleep(300 * time.Millisecond)

	events := []struct {
		name string
		do   func()
	}{
		{"certificate renewal", func() {
			published := strings.Count(p.Stderr.String(), "published workload certificate")
			chain, key := a.Root.Workload(t, 24*time.Hour)
			testkit.ReplaceFile(t, filepath.Join(a.certDir, "key.pem"), key)
			testkit.ReplaceFile(t, filepath.Join(a.certDir, "cert-chain.pem"), chain)
			p.WaitLog(t, "the renewed certificate published", func(log string) bool {
				return strings.Count(log, "published workload certificate") > published
			})
		}},
		{"NDS update", func() {
			if err := cp.SetNameTable(xdsserver.NameTable(map[string]string{
				"reviews.e2e.svc.cluster.local": "10.0.0.7", "ratings.e2e.svc.cluster.local": "10.0.0.8",
			})); err != nil {
				t.Fatal(err)
			}
			testkit.WaitFor(t, "the new name answered", func() bool {
				c := &dns.Client{Timeout: time.Second}
				r, _, err := c.Exchange(new(dns.Msg).SetQuestion("ratings.e2e.svc.cluster.local.", dns.TypeA), a.DNSAddr)
				return err == nil && answersA(r, "10.0.0.8")
			})
		}},
		{"xDS reconnect", func() {
			streams := upstreamStreams(cp.Stats())
			if err := cp.Restart(); err != nil {
				t.Fatal(err)
			}
			if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return upstreamStreams(s) > streams }); err != nil {
				t.Fatalf("the proxy did not reconnect: %v", err)
			}
		}},
		{"Envoy restart", func() {
			pids := p.EnvoyPIDs()
			if err := syscall.Kill(pids[len(pids)-1], syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			p.WaitLog(t, "a new Envoy", func(string) bool { return len(p.EnvoyPIDs()) > len(pids) })
			p.WaitStatus(t, "/healthz/ready", 200)
		}},
	}
	for _, e := range events {
		e.do()
		time.Sleep(300 * time.Millisecond) // DNS under load after the event too
	}
	sent := load.stop()
	t.Logf("renewal, NDS update, xDS reconnect and Envoy restart under DNS load: %d queries sent, %d lost, %d SERVFAIL, %d wrong answers",
		sent, load.lost.Load(), load.servfail.Load(), load.wrong.Load())
	if load.lost.Load() != 0 || load.servfail.Load() != 0 || load.wrong.Load() != 0 {
		t.Errorf("DNS queries failed: %d lost, %d SERVFAIL, %d wrong of %d (first: %v)",
			load.lost.Load(), load.servfail.Load(), load.wrong.Load(), sent, load.firstErr())
	}
	after := treeNodes(t, p)
	for _, name := range []string{"dns", "names"} {
		if !after[name].Since.Equal(before[name].Since) {
			t.Errorf("%s's run began anew: since %v, was %v", name, after[name].Since, before[name].Since)
		}
	}
	for name, b := range before {
		want := b.Restarts
		if name == "envoy" {
			want++ // killed on purpose
		}
		if got := after[name].Restarts; got != want {
			t.Errorf("%s: %d restarts, want %d", name, got, want)
		}
	}
}

// dnsAgent is an agent with file-mounted certificates, its control plane
// reached over TLS, and its DNS proxy forwarding to a resolver on
// loopback; reviews.e2e.svc.cluster.local is 10.0.0.7 in its name table,
// from a --name-table file (nametable) or from the control plane (NDS).
type dnsAgent struct {
	p          *e2ekit.AgentProcess
	cp         *xdsserver.Server
	serverCert *pki.ServerCert // the control plane's, reissued by a new root
	Root       *pki.CA         // the root the agent was started with
	certDir    string          // the file-mounted certificates
	upstream   *testkit.StubResolver
	DNSAddr    string
}

func startDNSAgent(t *testing.T, tableFile bool) *dnsAgent {
	t.Helper()
	upstream, why := testkit.StartStubResolver(t)
	if upstream == nil {
		t.Skip(why)
	}
	a := &dnsAgent{Root: pki.NewRoot(t, "mesh-root-0"), upstream: upstream, DNSAddr: fmt.Sprintf("127.0.0.1:%d", e2ekit.FreePort(t))}
	a.serverCert = pki.NewServerCert(t, a.Root, "127.0.0.1")
	cp, err := xdsserver.StartSmallMesh(xdsserver.Options{TLS: a.serverCert.TLS()}, "e2e",
		xdsserver.NameTable(map[string]string{"reviews.e2e.svc.cluster.local": "10.0.0.7"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	a.cp = cp
	dir := t.TempDir()
	resolv := filepath.Join(dir, "resolv.conf")
	testkit.WriteFile(t, resolv, []byte(upstream.ResolvConf()))
	env := []string{"DNS_PROXY_ADDR=" + a.DNSAddr}
	args := []string{"--resolv-conf", resolv}
	if tableFile {
		table := filepath.Join(dir, "names.json")
		testkit.WriteFile(t, table, []byte(`{"table": {"reviews.e2e.svc.cluster.local": {"ips": ["10.0.0.7"]}}}`))
		args = append(args, "--name-table", table)
	} else {
		env = append(env, "ISTIO_META_DNS_CAPTURE=true")
	}
	a.p = e2ekit.StartAgentWith(t, e2ekit.AgentOptions{ControlPlane: cp, Certs: func(d string) {
		a.certDir = d
		chain, key := a.Root.Workload(t, 24*time.Hour)
		testkit.WriteFile(t, filepath.Join(d, "cert-chain.pem"), chain)
		testkit.WriteFile(t, filepath.Join(d, "key.pem"), key)
		testkit.WriteFile(t, filepath.Join(d, "root-cert.pem"), a.Root.CertPEM)
	}}, env, args...)
	a.p.WaitStatus(t, "/healthz/ready", 200)
	return a
}

// upstreamStreams counts the streams a control plane has seen, of either
// protocol.
func upstreamStreams(s xdsserver.Stats) int { return s.Streams + s.DeltaStreams }

// treeNodes are the nodes of the agent's /debug/tree, by name.
func treeNodes(t *testing.T, p *e2ekit.AgentProcess) map[string]messages.ServiceInfo {
	t.Helper()
	body := p.WaitStatus(t, "/debug/tree?format=json", 200)
	var tree struct {
		Services []messages.ServiceInfo `json:"services"`
	}
	if err := json.Unmarshal([]byte(body), &tree); err != nil {
		t.Fatalf("/debug/tree: %v\n%s", err, body)
	}
	nodes := map[string]messages.ServiceInfo{}
	for _, s := range tree.Services {
		nodes[s.Name] = s
	}
	return nodes
}

// dnsLoad queries a DNS server at a steady rate, each query on its own
// (a slow answer does not slow the rate down), each name in turn, and
// counts what went wrong: lost (refused, nothing listening; or no answer
// within glibc's 5 s), SERVFAIL, or an answer other than the expected
// address.
type dnsLoad struct {
	sent, lost, servfail, wrong atomic.Int64
	done                        chan struct{}
	finished                    chan struct{}
	wg                          sync.WaitGroup
	mu                          sync.Mutex
	first                       error
}

func startDNSLoad(addr string, qps int, want map[string]string) *dnsLoad {
	l := &dnsLoad{done: make(chan struct{}), finished: make(chan struct{})}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	// glibc's timeout: a query lost to a restart is refused at once on
	// loopback (or dropped with the old socket); a generous timeout keeps a
	// loaded machine's slow answer from counting as lost.
	client := &dns.Client{Timeout: 5 * time.Second}
	go func() {
		defer close(l.finished)
		tick := time.NewTicker(time.Second / time.Duration(qps))
		defer tick.Stop()
		// Bounded: at most two minutes of queries, whatever the test does.
		limit := time.After(2 * time.Minute)
		for i := 0; ; i++ {
			select {
			case <-l.done:
				return
			case <-limit:
				return
			case <-tick.C:
			}
			name := names[i%len(names)]
			l.sent.Add(1)
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.ask(client, addr, name, want[name])
			}()
		}
	}()
	return l
}

func (l *dnsLoad) ask(c *dns.Client, addr, name, want string) {
	r, _, err := c.Exchange(new(dns.Msg).SetQuestion(name, dns.TypeA), addr)
	switch {
	case err != nil:
		l.lost.Add(1)
		l.note(fmt.Errorf("%s: %w", name, err))
	case r.Rcode == dns.RcodeServerFailure:
		l.servfail.Add(1)
		l.note(fmt.Errorf("%s: SERVFAIL", name))
	case !answersA(r, want):
		l.wrong.Add(1)
		l.note(fmt.Errorf("%s: %v, want %s", name, r.Answer, want))
	}
}

// answersA: r's one answer is the A record ip.
func answersA(r *dns.Msg, ip string) bool {
	if len(r.Answer) != 1 {
		return false
	}
	a, ok := r.Answer[0].(*dns.A)
	return ok && a.A.String() == ip
}

func (l *dnsLoad) note(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.first == nil {
		l.first = err
	}
}

func (l *dnsLoad) firstErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.first == nil {
		return errors.New("none")
	}
	return l.first
}

// stop ends the load, waits for the queries in flight, and returns how
// many were sent. A second stop does nothing.
func (l *dnsLoad) stop() int64 {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	<-l.finished
	l.wg.Wait()
	return l.sent.Load()
}
