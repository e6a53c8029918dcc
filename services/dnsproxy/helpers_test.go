package dnsproxy

import (
	"bytes"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startDnsmasq runs a real dnsmasq on port 53 of a random loopback address
// (resolv.conf cannot name a port) that answers *.upstream.test with
// 192.0.2.77 and forwards nothing anywhere. It returns the address.
func startDnsmasq(t testing.TB, extra ...string) string {
	t.Helper()
	bin, err := exec.LookPath("dnsmasq")
	if err != nil {
		t.Skip("dnsmasq not installed (apt-get install -y dnsmasq): no real upstream resolver")
	}
	if os.Getuid() != 0 {
		t.Skip("not root: dnsmasq must bind port 53 of a loopback address")
	}
	for attempt := 0; attempt < 5; attempt++ {
		ip := fmt.Sprintf("127.%d.%d.%d", 100+rand.IntN(100), 1+rand.IntN(250), 1+rand.IntN(250))
		args := append([]string{
			// -k, not --no-daemon: in debug mode dnsmasq answers TCP
			// inline and stops answering UDP while a TCP connection is
			// open; the proxy keeps idle TCP connections.
			"--keep-in-foreground", "--log-facility=-", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--port=53",
			"--listen-address=" + ip, "--bind-interfaces", "--pid-file=", "--user=root",
			"--address=/upstream.test/192.0.2.77",
		}, extra...)
		cmd := exec.Command(bin, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its TCP children die with it
		if err := cmd.Start(); err != nil {
			t.Fatalf("start dnsmasq: %v", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		stop := func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		c := &dns.Client{Timeout: 200 * time.Millisecond}
		for i := 0; i < 50; i++ {
			select {
			case <-exited:
				i = 50
				continue
			default:
			}
			m := new(dns.Msg).SetQuestion("probe.upstream.test.", dns.TypeA)
			if r, _, err := c.Exchange(m, ip+":53"); err == nil && len(r.Answer) == 1 {
				t.Cleanup(stop)
				return ip
			}
			time.Sleep(50 * time.Millisecond)
		}
		stop()
		t.Logf("dnsmasq on %s did not come up: %s", ip, stderr.String())
	}
	t.Fatal("dnsmasq did not start")
	return ""
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
	svc    *Service
	addr   string
	table  *messages.Cell[messages.NameTable]
	health *testkit.HealthRecorder
	reg    *prometheus.Registry
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
	p := &proxy{table: messages.NewCell[messages.NameTable](), health: &testkit.HealthRecorder{}, reg: prometheus.NewRegistry()}
	if nt != nil {
		p.table.Send(*nt)
	}
	svc, err := New(cfg, p.table, messages.NewRuntime(Name, p.health, nil, p.reg, testLogger(t)))
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
