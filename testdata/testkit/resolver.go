package testkit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
)

// StubResolver is an upstream resolver for the DNS proxy where Dnsmasq is
// not installed: a miekg/dns server, UDP and TCP, on port 53 of a random
// loopback address (resolv.conf cannot name a port), answering
// *.upstream.test with 192.0.2.77 as Dnsmasq does, NXDOMAIN otherwise,
// until the end of the test. It forwards nothing anywhere.
type StubResolver struct {
	IP string // the loopback address it listens on, port 53
	// Queries counts the questions it answered.
	Queries atomic.Int64
}

// StartStubResolver serves a StubResolver until the end of the test. It
// returns nil and why when it cannot run here (not root: port 53); the
// caller skips.
func StartStubResolver(t testing.TB) (*StubResolver, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil, "not root: the stub resolver must bind port 53 of a loopback address"
	}
	r := &StubResolver{}
	var udp net.PacketConn
	var tcp net.Listener
	for range 10 {
		ip := fmt.Sprintf("127.%d.%d.%d", 100+rand.IntN(100), 1+rand.IntN(250), 1+rand.IntN(250))
		pc, err := net.ListenPacket("udp", net.JoinHostPort(ip, "53"))
		if err != nil {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "53"))
		if err != nil {
			pc.Close()
			continue
		}
		r.IP, udp, tcp = ip, pc, l
		break
	}
	if udp == nil {
		t.Fatal("stub resolver: no loopback address with port 53 free")
	}
	servers := []*dns.Server{{PacketConn: udp, Handler: r}, {Listener: tcp, Handler: r}}
	done := make(chan struct{}, len(servers))
	for _, s := range servers {
		go func() { _ = s.ActivateAndServe(); done <- struct{}{} }()
	}
	t.Cleanup(func() {
		for _, s := range servers {
			_ = s.Shutdown()
		}
		for range servers {
			<-done
		}
	})
	return r, ""
}

// Addr is where it answers, IP:53.
func (r *StubResolver) Addr() string { return net.JoinHostPort(r.IP, "53") }

// ResolvConf is a resolv.conf naming only this resolver, with search.
func (r *StubResolver) ResolvConf(search ...string) string {
	s := "nameserver " + r.IP + "\n"
	if len(search) > 0 {
		s += "search " + strings.Join(search, " ") + "\n"
	}
	return s
}

// ServeDNS answers one query.
func (r *StubResolver) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	r.Queries.Add(1)
	m := new(dns.Msg).SetReply(q)
	if len(q.Question) == 1 && strings.HasSuffix(q.Question[0].Name, ".upstream.test.") {
		if q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
				A:   net.IPv4(192, 0, 2, 77),
			})
		}
	} else {
		m.Rcode = dns.RcodeNameError
	}
	_ = w.WriteMsg(m)
}
