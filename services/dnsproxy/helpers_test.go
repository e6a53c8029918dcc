package dnsproxy

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startDnsmasq is the test kit's dnsmasq, an upstream resolver answering
// *.upstream.test; the test is skipped where it cannot run.
func startDnsmasq(t testing.TB, extra ...string) string {
	t.Helper()
	ip, why := testkit.Dnsmasq(t, extra...)
	if ip == "" {
		t.Skip(why)
	}
	return ip
}

func writeResolvConf(t testing.TB, servers ...string) string {
	t.Helper()
	var b strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	b.WriteString("search default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n")
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// testTable is the mesh the tests resolve.
func testTable(version string) messages.NameTable {
	ip := netip.MustParseAddr
	many := make([]netip.Addr, 100)
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{10, 9, byte(i / 250), byte(i%250 + 1)})
	}
	return messages.NameTable{Version: version, Hosts: map[string]messages.NameInfo{
		"reviews.default.svc.cluster.local": {IPs: []netip.Addr{ip("10.0.0.1"), ip("10.0.0.2"), ip("fd00::1")},
			Registry: "Kubernetes", Shortname: "reviews", Namespace: "default", AltHosts: []string{"reviews.alias.test"}},
		"ratings.other.svc.cluster.local": {IPs: []netip.Addr{ip("10.0.1.1")},
			Registry: "Kubernetes", Shortname: "ratings", Namespace: "other"},
		"v6only.default.svc.cluster.local": {IPs: []netip.Addr{ip("fd00::2")},
			Registry: "Kubernetes", Shortname: "v6only", Namespace: "default"},
		"remote.default.svc.cluster.remote": {IPs: []netip.Addr{ip("10.0.2.1")},
			Registry: "Kubernetes", Shortname: "remote", Namespace: "default"},
		"*.wild.example.com":   {IPs: []netip.Addr{ip("192.0.2.10")}},
		"external.example.com": {IPs: []netip.Addr{ip("192.0.2.20")}, AltHosts: []string{"ignored.example.com"}},
		"many.example.com":     {IPs: many},
		"noips.example.com":    {},
	}}
}

// proxy is a running Service under test.
type proxy struct {
	svc   *Service
	addr  string
	table *messages.Cell[messages.NameTable]
	// answering is the table the proxy published it answers from.
	answering *messages.Cell[messages.DNSTable]
	health    *testkit.HealthRecorder
	reg       *prometheus.Registry
}

func startProxy(t testing.TB, cfg Config, nt *messages.NameTable) *proxy {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "default"
	}
	if cfg.ForwardTimeout == 0 {
		cfg.ForwardTimeout = 5 * time.Second // Istio's DNS_FORWARD_TIMEOUT
	}
	p := &proxy{table: messages.NewCell[messages.NameTable](), answering: messages.NewCell[messages.DNSTable](), health: &testkit.HealthRecorder{}, reg: prometheus.NewRegistry()}
	if nt != nil {
		p.table.Send(*nt)
	}
	svc, err := New(cfg, Inputs{Table: p.table}, Outputs{Answering: p.answering}, messages.NewRuntime(Name, p.health, nil, p.reg, testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	p.svc = svc
	testkit.Serve(t, svc)
	p.health.WaitLast(t, "listening", func(h messages.Health) bool { return h.State == messages.Ready || h.State == messages.Starting })
	p.addr = svc.Addrs()[0]
	return p
}

func exchange(t testing.TB, addr, name string, qtype uint16, network string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg).SetQuestion(name, qtype)
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
	}
	return r
}

// queryConcurrently starts clients goroutines that each ask addr, over
// UDP, up to queries A questions (name(g, i): goroutine g's i-th) until
// stop is closed (nil: never). wait waits for them and counts the answers
// ok accepts and the others (failed exchanges included).
func queryConcurrently(addr string, clients, queries int, stop <-chan struct{}, name func(g, i int) string,
	ok func(name string, r *dns.Msg) bool,
) (wait func() (good, bad int64)) {
	var wg sync.WaitGroup
	var nGood, nBad atomic.Int64
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &dns.Client{Timeout: 5 * time.Second}
			for i := range queries {
				select {
				case <-stop:
					return
				default:
				}
				q := name(g, i)
				if r, _, err := c.Exchange(new(dns.Msg).SetQuestion(q, dns.TypeA), addr); err == nil && ok(q, r) {
					nGood.Add(1)
				} else {
					nBad.Add(1)
				}
			}
		}()
	}
	return func() (int64, int64) {
		wg.Wait()
		return nGood.Load(), nBad.Load()
	}
}

// addrs returns the answer's A/AAAA addresses, sorted, and CNAME targets.
func answers(r *dns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			out = append(out, rr.Hdr.Name+" A "+rr.A.String())
		case *dns.AAAA:
			out = append(out, rr.Hdr.Name+" AAAA "+rr.AAAA.String())
		case *dns.CNAME:
			out = append(out, rr.Hdr.Name+" CNAME "+rr.Target)
		case *dns.TXT:
			out = append(out, rr.Hdr.Name+" TXT")
		}
	}
	return out
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("DNSPROXY_TEST_DEBUG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
