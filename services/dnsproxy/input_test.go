package dnsproxy

import (
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestConfigValidate(t *testing.T) {
	resolv := writeResolvConf(t, "127.99.0.1") // a loopback nameserver: nothing here forwards
	valid := func(listen string) Config {
		return Config{Listen: listen, ResolvConf: resolv, ForwardTimeout: 5 * time.Second}
	}
	good := []string{"localhost:15053", "127.0.0.1:15053", "127.0.0.53:53", "[::1]:15053", "127.0.0.1:0"}
	for _, l := range good {
		if err := valid(l).Validate(); err != nil {
			t.Errorf("Listen %q: %v", l, err)
		}
	}
	for _, l := range []string{":15053", "0.0.0.0:15053", "10.1.2.3:53", "[::]:15053", "example.com:53"} {
		err := valid(l).Validate()
		if !errors.Is(err, ErrNotLoopback) || !strings.Contains(err.Error(), l) {
			t.Errorf("Listen %q: %v, want ErrNotLoopback naming it", l, err)
		}
	}
	testkit.EachEditRejected(t, valid("localhost:15053"), map[string]func(*Config){
		"no listen":           func(c *Config) { c.Listen = "" },
		"listen without port": func(c *Config) { c.Listen = "127.0.0.1" },
		"listen with a name":  func(c *Config) { c.Listen = "127.0.0.1:http2x" },
		"no resolv.conf":      func(c *Config) { c.ResolvConf = "" },
		"no forward timeout":  func(c *Config) { c.ForwardTimeout = 0 },
		"negative timeout":    func(c *Config) { c.ForwardTimeout = -time.Second },
		"bad search domain":   func(c *Config) { c.Search = []string{"bad..domain"} },
		"bad cluster domain":  func(c *Config) { c.Domain = "bad..domain" },
	})
	if _, err := New(valid("0.0.0.0:53"), Inputs{Table: messages.NewCell[messages.NameTable]()}, Outputs{}, messages.NewRuntime(Name, &testkit.HealthRecorder{}, nil, nil, nil)); err == nil {
		t.Error("New accepted a non-loopback address")
	}
}

func TestListenAddrs(t *testing.T) {
	cases := []struct {
		listen  string
		servers []string
		want    string
	}{
		{"localhost:15053", []string{"10.96.0.10:53"}, "127.0.0.1:15053"},
		{"localhost:15053", []string{"[fd00::10]:53"}, "[::1]:15053"},
		{"localhost:15053", []string{"10.96.0.10:53", "[fd00::10]:53"}, "127.0.0.1:15053 [::1]:15053"},
		{"127.0.0.2:53", []string{"[fd00::10]:53"}, "127.0.0.2:53"},
	}
	for _, c := range cases {
		if got := strings.Join(listenAddrs(c.listen, c.servers), " "); got != c.want {
			t.Errorf("listenAddrs(%s, %v) = %s, want %s", c.listen, c.servers, got, c.want)
		}
	}
}

func TestResolvConfErrors(t *testing.T) {
	cell := messages.NewCell[messages.NameTable]()
	svc, err := New(Config{Listen: "127.0.0.1:0", ResolvConf: "/nonexistent/resolv.conf", ForwardTimeout: time.Second}, Inputs{Table: cell}, Outputs{}, messages.NewRuntime(Name, &testkit.HealthRecorder{}, nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Serve(t.Context()); err == nil || !strings.Contains(err.Error(), "/nonexistent/resolv.conf") {
		t.Errorf("missing resolv.conf: %v", err)
	}
	empty := writeResolvConf(t)
	svc, _ = New(Config{Listen: "127.0.0.1:0", ResolvConf: empty, ForwardTimeout: time.Second}, Inputs{Table: cell}, Outputs{}, messages.NewRuntime(Name, &testkit.HealthRecorder{}, nil, nil, nil))
	if err := svc.Serve(t.Context()); err == nil || !strings.Contains(err.Error(), "no nameserver") {
		t.Errorf("resolv.conf without nameserver: %v", err)
	}
}

func TestListenConflict(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	svc, _ := New(Config{Listen: pc.LocalAddr().String(), ResolvConf: writeResolvConf(t, "127.99.0.1"), ForwardTimeout: time.Second},
		Inputs{Table: messages.NewCell[messages.NameTable]()}, Outputs{}, messages.NewRuntime(Name, &testkit.HealthRecorder{}, nil, nil, nil))
	if err := svc.Serve(t.Context()); err == nil || !strings.Contains(err.Error(), pc.LocalAddr().String()) {
		t.Errorf("port in use: %v", err)
	}
}

// Bad packets get FORMERR, NOTIMP or REFUSED, or are dropped; the proxy
// keeps answering.
func TestBadInput(t *testing.T) {
	nt := testTable("v1")
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, "127.99.0.1"), ForwardTimeout: time.Second}, &nt)
	conn, err := net.Dial("udp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	send := func(what string, pkt []byte) *dns.Msg {
		t.Helper()
		if _, err := conn.Write(pkt); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		buf := make([]byte, 4096)
		n, err := conn.Read(buf)
		if err != nil {
			return nil // dropped
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:n]); err != nil {
			t.Fatalf("%s: unparsable answer: %v", what, err)
		}
		return r
	}
	q := func(mut func(m *dns.Msg)) []byte {
		m := new(dns.Msg).SetQuestion("reviews.", dns.TypeA)
		mut(m)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rcode := func(r *dns.Msg) string {
		if r == nil {
			return "dropped"
		}
		return dns.RcodeToString[r.Rcode]
	}
	cases := []struct {
		what string
		pkt  []byte
		want []string
	}{
		{"garbage", []byte{1, 2, 3}, []string{"dropped"}},
		{"header only, bad body", append(q(func(*dns.Msg) {})[:12], 0xff, 0xff), []string{"FORMERR", "dropped"}},
		{"zero questions", q(func(m *dns.Msg) { m.Question = nil }), []string{"FORMERR"}},
		{"two questions", q(func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) }), []string{"FORMERR"}},
		{"class CH", q(func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }), []string{"REFUSED"}},
		{"class ANY", q(func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassANY }), []string{"REFUSED"}},
		{"opcode UPDATE", q(func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate }), []string{"NOTIMP", "FORMERR"}},
		{"a response", q(func(m *dns.Msg) { m.Response = true }), []string{"dropped"}},
		{"compression loop", loopPacket(), []string{"FORMERR", "dropped"}},
	}
	for _, c := range cases {
		got := rcode(send(c.what, c.pkt))
		ok := false
		for _, w := range c.want {
			ok = ok || got == w
		}
		if !ok {
			t.Errorf("%s: %s, want one of %v", c.what, got, c.want)
		}
	}
	// A name of 255 octets is answered (forwarded, SERVFAIL here), not a crash.
	long := strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("b", 61) + "."
	if r := send("longest name", q(func(m *dns.Msg) { m.Question[0].Name = long })); r == nil || r.Rcode != dns.RcodeServerFailure {
		t.Errorf("longest name: %v", r)
	}

	// TCP: a length prefix promising more than comes, then close; and the
	// maximum length with nothing after.
	for _, pkt := range [][]byte{{0xff, 0xff, 1, 2, 3}, {0x00}, {0x00, 0x05, 1, 2, 3, 4, 5}} {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(pkt)
		c.Close()
	}
	// Still answering, over both.
	for _, network := range []string{"udp", "tcp"} {
		if r := exchange(t, p.addr, "reviews.", dns.TypeA, network); len(r.Answer) != 2 {
			t.Errorf("%s after bad input: %v", network, r)
		}
	}
}

// loopPacket is a query whose name is a compression pointer to itself.
func loopPacket() []byte {
	b := make([]byte, 12, 20)
	binary.BigEndian.PutUint16(b[0:], 0x1234)
	binary.BigEndian.PutUint16(b[4:], 1)
	b = append(b, 0xc0, 12, 0, 1, 0, 1)
	return b
}

func TestBuildTable(t *testing.T) {
	nt := testTable("v1")
	tb := buildTable(nt, "default", "default.svc.cluster.local", []string{"default.svc.cluster.local"})
	if tb.hosts != 7 {
		t.Errorf("hosts = %d, want 7 (the host without addresses is left out)", tb.hosts)
	}
	for _, name := range []string{"reviews.", "reviews.default.", "reviews.default.svc.", "reviews.default.svc.cluster.local.",
		"reviews.alias.test.", "v6only.", "ratings.other.", "ratings.other.svc.", "remote.default.svc.cluster.remote.",
		"external.example.com.", "many.example.com."} {
		if m := tb.lookup(name); m.host == nil || m.cname || m.owner != name {
			t.Errorf("%s: not a host name: %+v", name, m)
		}
	}
	for _, name := range []string{"ratings.", "remote.", "remote.default.", "ignored.example.com.", "noips.example.com."} {
		if m := tb.lookup(name); m.host != nil {
			t.Errorf("%s: should not be a name", name)
		}
	}
	// Expansions: of every name, except when it is a real name.
	if m := tb.lookup("reviews.default.default.svc.cluster.local."); m.host == nil || !m.cname || m.owner != "reviews.default." {
		t.Errorf("expansion of reviews.default.: %+v", m)
	}
	if m := tb.lookup("reviews.default.svc.cluster.local."); m.cname {
		t.Error("reviews. expanded over the real name")
	}
	if m := tb.lookup("a.wild.example.com.default.svc.cluster.local."); m.host == nil || !m.cname || m.owner != "a.wild.example.com." {
		t.Errorf("no expansion of the wildcard: %+v", m)
	}
	// Not an expansion: the search domain must follow a whole label.
	if m := tb.lookup("reviewsdefault.svc.cluster.local."); m.host != nil {
		t.Errorf("reviewsdefault.svc.cluster.local. taken for an expansion: %+v", m)
	}
	// Without a search list: no expansions.
	tb = buildTable(nt, "default", "default.svc.cluster.local", nil)
	for _, name := range []string{"reviews.default.default.svc.cluster.local.", "a.wild.example.com.default.svc.cluster.local."} {
		if m := tb.lookup(name); m.host != nil {
			t.Errorf("expansion %s without a search list: %+v", name, m)
		}
	}
}

// A real name always wins over another host's search expansion.
func TestRealNameBeatsExpansion(t *testing.T) {
	nt := testTable("v1")
	nt.Hosts["a.example.default.svc.cluster.local"] = messages.NameInfo{IPs: nt.Hosts["many.example.com"].IPs[:1]}
	nt.Hosts["a.example"] = nt.Hosts["external.example.com"]
	for i := 0; i < 20; i++ { // map order varies
		tb := buildTable(nt, "default", "default.svc.cluster.local", []string{"default.svc.cluster.local"})
		if m := tb.lookup("a.example.default.svc.cluster.local."); m.host == nil || m.cname {
			t.Fatalf("real name replaced by an expansion: %+v", m)
		}
	}
}

// Answers with the wrong ID or another question (spoofing, stray late
// answers) are ignored; the real one, even in other case, is taken.
func TestUpstreamAnswerMatching(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.99.0.4:53")
	if err != nil {
		t.Skipf("cannot bind 127.99.0.4:53: %v", err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := new(dns.Msg)
			if q.Unpack(buf[:n]) != nil {
				continue
			}
			reply := func(mut func(r *dns.Msg)) {
				r := new(dns.Msg).SetReply(q)
				r.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
					A: net.IPv4(192, 0, 2, 99)}}
				mut(r)
				b, _ := r.Pack()
				pc.WriteTo(b, from)
			}
			reply(func(r *dns.Msg) { r.Question[0].Name = "evil.example."; r.Answer[0].(*dns.A).A = net.IPv4(6, 6, 6, 6) })
			reply(func(r *dns.Msg) { r.Id++; r.Answer[0].(*dns.A).A = net.IPv4(6, 6, 6, 7) })
			reply(func(r *dns.Msg) { r.Question[0].Qtype = dns.TypeAAAA; r.Answer[0].(*dns.A).A = net.IPv4(6, 6, 6, 8) })
			reply(func(r *dns.Msg) { r.Question[0].Name = strings.ToUpper(r.Question[0].Name) })
		}
	}()
	defer func() { pc.Close(); <-served }()
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, "127.99.0.4")}, nil)
	for i := 0; i < 5; i++ {
		r := exchange(t, p.addr, "match.example.", dns.TypeA, "udp")
		if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "192.0.2.99" {
			t.Fatalf("got %v", r.Answer)
		}
	}
}

// "localhost" binds IPv4 and IPv6 loopback when resolv.conf has servers of
// both families, each answering over udp and tcp.
func TestLocalhostDualStack(t *testing.T) {
	if pc, err := net.ListenPacket("udp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		pc.Close()
	}
	nt := testTable("v1")
	p := startProxy(t, Config{Listen: "localhost:0", ResolvConf: writeResolvConf(t, "127.99.0.1", "::1")}, &nt)
	addrs := p.svc.Addrs()
	if len(addrs) != 2 || !strings.HasPrefix(addrs[0], "127.0.0.1:") || !strings.HasPrefix(addrs[1], "[::1]:") {
		t.Fatalf("Addrs = %v", addrs)
	}
	for _, a := range addrs {
		for _, network := range []string{"udp", "tcp"} {
			if r := exchange(t, a, "reviews.", dns.TypeAAAA, network); len(r.Answer) != 1 {
				t.Errorf("%s %s: %v", a, network, r)
			}
		}
	}
}

// Replies the proxy makes itself — local answers, NODATA, and the errors
// (SERVFAIL when upstream is down, NOTIMP) — leave RA (recursion
// available) clear, as Istio's do (dns.Msg.SetReply/SetRcode); a query's
// RD is echoed. The differential against Istio's agent on a real istiod found
// that ours set RA.
func TestOwnRepliesLeaveRecursionAvailableClear(t *testing.T) {
	nt := testTable("v1")
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, "127.99.0.1"), ForwardTimeout: time.Second}, &nt)
	ask := func(name string, qtype uint16, opcode int, network string) *dns.Msg {
		t.Helper()
		m := new(dns.Msg).SetQuestion(name, qtype)
		m.Opcode = opcode
		c := &dns.Client{Net: network, Timeout: 5 * time.Second}
		r, _, err := c.Exchange(m, p.addr)
		if err != nil {
			t.Fatalf("%s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
		}
		return r
	}
	for _, network := range []string{"udp", "tcp"} {
		for _, c := range []struct {
			what   string
			name   string
			qtype  uint16
			opcode int
			rcode  int
		}{
			{"local answer", "reviews.", dns.TypeA, dns.OpcodeQuery, dns.RcodeSuccess},
			{"NODATA", "v6only.default.svc.cluster.local.", dns.TypeA, dns.OpcodeQuery, dns.RcodeSuccess},
			{"upstream down", "x.upstream.test.", dns.TypeA, dns.OpcodeQuery, dns.RcodeServerFailure},
			{"other opcode", "reviews.", dns.TypeA, dns.OpcodeStatus, dns.RcodeNotImplemented},
		} {
			r := ask(c.name, c.qtype, c.opcode, network)
			if r.Rcode != c.rcode || r.RecursionAvailable || (c.opcode == dns.OpcodeQuery && !r.RecursionDesired) {
				t.Errorf("%s over %s: rcode %s ra=%v rd=%v, want %s with RA clear and a query's RD echoed", c.what, network,
					dns.RcodeToString[r.Rcode], r.RecursionAvailable, r.RecursionDesired, dns.RcodeToString[c.rcode])
			}
		}
	}
}
