package dnsproxy

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func sortedAnswers(r *dns.Msg) []string {
	a := answers(r)
	slices.Sort(a)
	return a
}

func TestLocalAnswers(t *testing.T) {
	up := startDnsmasq(t)
	nt := testTable("v1")
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, up)}, &nt)
	p.health.WaitLast(t, "ready", func(h messages.Health) bool { return h.State == messages.Ready })

	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			cases := []struct {
				name  string
				qtype uint16
				want  []string // sorted
			}{
				{"reviews.default.svc.cluster.local.", dns.TypeA, []string{
					"reviews.default.svc.cluster.local. A 10.0.0.1", "reviews.default.svc.cluster.local. A 10.0.0.2"}},
				{"reviews.default.svc.cluster.local.", dns.TypeAAAA, []string{"reviews.default.svc.cluster.local. AAAA fd00::1"}},
				// Known host without that family: NODATA.
				{"ratings.other.svc.cluster.local.", dns.TypeAAAA, nil},
				{"v6only.default.svc.cluster.local.", dns.TypeA, nil},
				// Alt hosts of a Kubernetes service.
				{"reviews.", dns.TypeA, []string{"reviews. A 10.0.0.1", "reviews. A 10.0.0.2"}},
				{"reviews.default.", dns.TypeA, []string{"reviews.default. A 10.0.0.1", "reviews.default. A 10.0.0.2"}},
				{"reviews.default.svc.", dns.TypeA, []string{"reviews.default.svc. A 10.0.0.1", "reviews.default.svc. A 10.0.0.2"}},
				{"reviews.alias.test.", dns.TypeA, []string{"reviews.alias.test. A 10.0.0.1", "reviews.alias.test. A 10.0.0.2"}},
				{"ratings.other.", dns.TypeA, []string{"ratings.other. A 10.0.1.1"}},
				{"ratings.other.svc.", dns.TypeA, []string{"ratings.other.svc. A 10.0.1.1"}},
				// Case does not matter.
				{"REVIEWS.Default.svc.cluster.local.", dns.TypeAAAA, []string{"reviews.default.svc.cluster.local. AAAA fd00::1"}},
				// Search expansion: CNAME to the host, chained with its records.
				{"ratings.other.default.svc.cluster.local.", dns.TypeA, []string{
					"ratings.other. A 10.0.1.1", "ratings.other.default.svc.cluster.local. CNAME ratings.other."}},
				{"external.example.com.default.svc.cluster.local.", dns.TypeA, []string{
					"external.example.com. A 192.0.2.20", "external.example.com.default.svc.cluster.local. CNAME external.example.com."}},
				// Wildcards, at any depth, renamed to the query.
				{"foo.wild.example.com.", dns.TypeA, []string{"foo.wild.example.com. A 192.0.2.10"}},
				{"a.b.wild.example.com.", dns.TypeA, []string{"a.b.wild.example.com. A 192.0.2.10"}},
				{"foo.wild.example.com.default.svc.cluster.local.", dns.TypeA, []string{
					"foo.wild.example.com. A 192.0.2.10", "foo.wild.example.com.default.svc.cluster.local. CNAME foo.wild.example.com."}},
				{"foo.wild.example.com.", dns.TypeAAAA, nil},
			}
			for _, c := range cases {
				r := exchange(t, p.addr, c.name, c.qtype, network)
				if r.Rcode != dns.RcodeSuccess || !r.Authoritative {
					t.Errorf("%s %s: rcode %s aa=%v, want authoritative NOERROR", c.name, dns.TypeToString[c.qtype],
						dns.RcodeToString[r.Rcode], r.Authoritative)
					continue
				}
				if got := sortedAnswers(r); !slices.Equal(got, c.want) {
					t.Errorf("%s %s: got %q, want %q", c.name, dns.TypeToString[c.qtype], got, c.want)
				}
				for _, rr := range r.Answer {
					if rr.Header().Ttl != 30 {
						t.Errorf("%s: TTL %d, want 30", c.name, rr.Header().Ttl)
					}
				}
				if len(r.Answer) > 1 {
					if _, ok := r.Answer[0].(*dns.CNAME); strings.Contains(strings.Join(c.want, " "), "CNAME") && !ok {
						t.Errorf("%s: CNAME not first: %v", c.name, r.Answer)
					}
				}
			}
		})
	}

	// Not local: forwarded to the upstream, which does not know them.
	for _, name := range []string{
		"ratings.",                           // short name of another namespace
		"remote.default.",                    // a host outside the proxy's domain gets no alt hosts
		"wild.example.com.",                  // the wildcard's own name does not match it
		"ignored.example.com.",               // altHosts only for Kubernetes services
		"noips.example.com.",                 // a host without addresses is not known
		"reviews.default.svc.cluster.local.", // (MX below)
	} {
		qtype := dns.TypeA
		if strings.HasPrefix(name, "reviews") {
			qtype = dns.TypeMX
		}
		r := exchange(t, p.addr, name, qtype, "udp")
		if r.Authoritative || len(r.Answer) != 0 {
			t.Errorf("%s %s: answered locally: %v", name, dns.TypeToString[qtype], r)
		}
	}
	if got := testutil.ToFloat64(p.svc.metrics.localAnswers); got < 30 {
		t.Errorf("dns_local_answers_total = %v", got)
	}
	if got := testutil.ToFloat64(p.svc.metrics.upstreamRequests); got != 6 {
		t.Errorf("dns_upstream_requests_total = %v, want 6", got)
	}
}

// Addresses come back in varying order (round robin).
func TestAnswersShuffled(t *testing.T) {
	up := startDnsmasq(t)
	nt := testTable("v1")
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, up)}, &nt)
	firsts := map[string]bool{}
	for i := 0; i < 50 && len(firsts) < 2; i++ {
		m := new(dns.Msg).SetQuestion("many.example.com.", dns.TypeA)
		m.SetEdns0(4096, false)
		r, err := dns.Exchange(m, p.addr)
		if err != nil {
			t.Fatal(err)
		}
		firsts[r.Answer[0].(*dns.A).A.String()] = true
	}
	if len(firsts) < 2 {
		t.Fatalf("50 answers all started with the same address: %v", firsts)
	}
}

func TestForwarded(t *testing.T) {
	up := startDnsmasq(t, "--host-record=host.upstream.test,192.0.2.5,2001:db8::5")
	nt := testTable("v1")
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, up), ForwardTimeout: 500 * time.Millisecond}, &nt)
	for _, network := range []string{"udp", "tcp"} {
		r := exchange(t, p.addr, "x.upstream.test.", dns.TypeA, network)
		if got := answers(r); len(got) != 1 || got[0] != "x.upstream.test. A 192.0.2.77" {
			t.Errorf("%s: x.upstream.test = %v", network, got)
		}
		r = exchange(t, p.addr, "host.upstream.test.", dns.TypeAAAA, network)
		if got := answers(r); len(got) != 1 || got[0] != "host.upstream.test. AAAA 2001:db8::5" {
			t.Errorf("%s: host.upstream.test AAAA = %v", network, got)
		}
	}
	// Many concurrent forwards share a few sockets; every answer matches
	// its own question.
	_, bad := queryConcurrently(p.addr, 8, 50, nil, func(g, i int) string {
		return "n" + string(rune('a'+g)) + string(rune('a'+i%26)) + ".upstream.test."
	}, func(name string, r *dns.Msg) bool {
		return len(r.Answer) == 1 && r.Answer[0].Header().Name == name
	})()
	if bad != 0 {
		t.Fatalf("%d of 400 concurrent forwarded queries failed", bad)
	}
}

func TestUpstreamDownServfail(t *testing.T) {
	// Nothing listens on port 53 of this address: the proxy gets ICMP
	// port unreachable at once.
	nt := testTable("v1")
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, "127.99.0.1"), ForwardTimeout: 2 * time.Second}, &nt)
	for _, network := range []string{"udp", "tcp"} {
		r := exchange(t, p.addr, "x.upstream.test.", dns.TypeA, network)
		if r.Rcode != dns.RcodeServerFailure {
			t.Errorf("%s: rcode %s, want SERVFAIL", network, dns.RcodeToString[r.Rcode])
		}
	}
	if got := testutil.ToFloat64(p.svc.metrics.upstreamFailures); got != 2 {
		t.Errorf("dns_upstream_failures_total = %v, want 2", got)
	}
	// Local names still answer.
	if r := exchange(t, p.addr, "reviews.", dns.TypeA, "udp"); len(r.Answer) != 2 {
		t.Errorf("reviews. = %v", r)
	}
}

func TestUpstreamTimeoutServfail(t *testing.T) {
	// An upstream whose sockets read and never answer: the exchange times
	// out.
	_, _, ip := listenUpstream(t)
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, ip), ForwardTimeout: 300 * time.Millisecond}, nil)
	r := exchange(t, p.addr, "x.upstream.test.", dns.TypeA, "udp")
	if r.Rcode != dns.RcodeServerFailure {
		t.Errorf("rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
}

func TestNextServerAndParallel(t *testing.T) {
	up := startDnsmasq(t)
	for _, parallel := range []bool{false, true} {
		p := startProxy(t, Config{ResolvConf: writeResolvConf(t, "127.99.0.3", up), ForwardParallel: parallel}, nil)
		r := exchange(t, p.addr, "x.upstream.test.", dns.TypeA, "udp")
		if got := answers(r); len(got) != 1 {
			t.Errorf("parallel=%v: first server down, second up: got %v (rcode %s)", parallel, got, dns.RcodeToString[r.Rcode])
		}
	}
}

// Before the first table the proxy forwards everything and reports
// Starting with Istio's reason; the table makes it Ready.
func TestBeforeFirstTable(t *testing.T) {
	up := startDnsmasq(t)
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, up)}, nil)
	h := p.health.WaitLast(t, "starting", func(h messages.Health) bool { return h.State == messages.Starting })
	if h.Reason != "DNS lookup table is not ready yet" || h.Service != "dns" {
		t.Fatalf("health = %+v", h)
	}
	if r := exchange(t, p.addr, "x.upstream.test.", dns.TypeA, "udp"); len(r.Answer) != 1 {
		t.Fatalf("forwarded before the table: %v", r)
	}
	if r := exchange(t, p.addr, "reviews.", dns.TypeA, "udp"); r.Authoritative || len(r.Answer) != 0 {
		t.Fatalf("answered a mesh name before the table: %v", r)
	}
	p.table.Send(testTable("v1"))
	p.health.WaitLast(t, "ready", func(h messages.Health) bool { return h.State == messages.Ready })
	if r := exchange(t, p.addr, "reviews.", dns.TypeA, "udp"); len(r.Answer) != 2 {
		t.Fatalf("after the table: %v", r)
	}
}

func TestTruncation(t *testing.T) {
	var txt []string
	for i := 0; i < 8; i++ {
		txt = append(txt, "--txt-record=big.upstream.test,"+strings.Repeat(string(rune('a'+i)), 250))
	}
	up := startDnsmasq(t, txt...)
	nt := testTable("v1")
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, up)}, &nt)

	// Local: 100 addresses do not fit 512 bytes.
	m := new(dns.Msg).SetQuestion("many.example.com.", dns.TypeA)
	r, _, err := (&dns.Client{}).Exchange(m, p.addr)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Truncated || len(r.Answer) >= 100 {
		t.Errorf("plain UDP: truncated=%v answers=%d, want TC and fewer than 100", r.Truncated, len(r.Answer))
	}
	r.Compress = true // as it came on the wire
	if b, _ := r.Pack(); len(b) > 512 {
		t.Errorf("plain UDP answer is %d bytes", len(b))
	}
	m.SetEdns0(4096, false)
	if r, _, _ = (&dns.Client{UDPSize: 4096}).Exchange(m, p.addr); r == nil || r.Truncated || len(r.Answer) != 100 {
		t.Errorf("EDNS0 4096: %v", r)
	}
	if r := exchange(t, p.addr, "many.example.com.", dns.TypeA, "tcp"); r.Truncated || len(r.Answer) != 100 {
		t.Errorf("TCP: truncated=%v answers=%d", r.Truncated, len(r.Answer))
	}

	// Forwarded: ~2 KB of TXT. dnsmasq truncates over UDP (its EDNS limit
	// is 1232); the proxy fetches it whole over TCP and hands it over UDP to
	// a client that takes 4096 bytes. (Istio would pass the TC on.)
	q := new(dns.Msg).SetQuestion("big.upstream.test.", dns.TypeTXT)
	q.SetEdns0(4096, false)
	direct, _, err := (&dns.Client{UDPSize: 4096}).Exchange(q, up+":53")
	if err != nil {
		t.Fatal(err)
	}
	if !direct.Truncated {
		t.Fatalf("dnsmasq did not truncate the big TXT answer: the test proves nothing (%d answers)", len(direct.Answer))
	}
	r, _, err = (&dns.Client{UDPSize: 4096}).Exchange(q, p.addr)
	if err != nil {
		t.Fatal(err)
	}
	if r.Truncated || len(r.Answer) != 8 {
		t.Errorf("forwarded big TXT over UDP 4096: truncated=%v answers=%d, want 8 whole", r.Truncated, len(r.Answer))
	}
	q.SetEdns0(512, false)
	q2 := new(dns.Msg).SetQuestion("big.upstream.test.", dns.TypeTXT)
	if r, _, err = (&dns.Client{}).Exchange(q2, p.addr); err != nil || !r.Truncated {
		t.Errorf("forwarded big TXT to a 512-byte client: %v %v, want TC", r, err)
	}
}

// Queries keep being answered, from one table or the other, while tables
// are swapped under them.
func TestTableSwapUnderLoad(t *testing.T) {
	up := startDnsmasq(t)
	v1, v2 := testTable("v1"), testTable("v2")
	v2.Hosts["reviews.default.svc.cluster.local"] = messages.NameInfo{IPs: v1.Hosts["ratings.other.svc.cluster.local"].IPs,
		Registry: "Kubernetes", Shortname: "reviews", Namespace: "default"}
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, up)}, &v1)
	stop := make(chan struct{})
	wait := queryConcurrently(p.addr, 4, 2000, stop, func(int, int) string { return "reviews." }, func(_ string, r *dns.Msg) bool {
		return r.Rcode == dns.RcodeSuccess && (len(r.Answer) == 1 || len(r.Answer) == 2)
	})
	for i := 0; i < 100; i++ {
		if i%2 == 0 {
			p.table.Send(v2)
		} else {
			p.table.Send(v1)
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(stop)
	if good, bad := wait(); bad != 0 || good == 0 {
		t.Fatalf("during swaps: %d good, %d bad answers", good, bad)
	}
	p.table.Send(v2)
	testkit.WaitFor(t, "the last table applied", func() bool {
		return len(exchange(t, p.addr, "reviews.", dns.TypeA, "udp").Answer) == 1
	})
}

func TestDig(t *testing.T) {
	dig, err := exec.LookPath("dig")
	if err != nil {
		t.Skip("dig not installed (apt-get install -y dnsutils)")
	}
	up := startDnsmasq(t)
	nt := testTable("v1")
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, up)}, &nt)
	host, port, _ := net.SplitHostPort(p.addr)
	run := func(args ...string) string {
		out, err := exec.Command(dig, append([]string{"@" + host, "-p", port, "+time=5", "+tries=1"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("dig %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	lines := func(s string) []string {
		f := strings.Fields(s)
		slices.Sort(f)
		return f
	}
	if got := lines(run("+short", "reviews.default.svc.cluster.local")); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Errorf("dig reviews: %q", got)
	}
	if got := lines(run("+short", "+tcp", "reviews", "AAAA")); !slices.Equal(got, []string{"fd00::1"}) {
		t.Errorf("dig +tcp reviews AAAA: %q", got)
	}
	if got := lines(run("+short", "x.upstream.test")); !slices.Equal(got, []string{"192.0.2.77"}) {
		t.Errorf("dig forwarded: %q", got)
	}
	out := run("ratings.other.svc.cluster.local", "AAAA")
	if !strings.Contains(out, "status: NOERROR") || !strings.Contains(out, "ANSWER: 0") || !strings.Contains(out, " aa ") {
		t.Errorf("dig NODATA: %s", out)
	}
	// dig retries over TCP on TC and gets all 100.
	if got := lines(run("+short", "+noedns", "many.example.com")); len(got) != 100 {
		t.Errorf("dig many (TC then TCP): %d addresses", len(got))
	}
}

func TestServeStopsAndRestarts(t *testing.T) {
	up := startDnsmasq(t)
	nt := testTable("v1")
	cell := messages.NewCell[messages.NameTable]()
	cell.Send(nt)
	h := &testkit.HealthRecorder{}
	svc, err := New(Config{Listen: "127.0.0.1:0", Namespace: "default", ResolvConf: writeResolvConf(t, up), ForwardTimeout: 5 * time.Second}, Inputs{Table: cell}, Outputs{}, messages.NewRuntime(Name, h, nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	for run := 0; run < 2; run++ {
		serving := testkit.Serve(t, svc)
		h.WaitLast(t, "ready", func(v messages.Health) bool { return v.State == messages.Ready })
		for len(svc.Addrs()) == 0 {
			time.Sleep(time.Millisecond)
		}
		addr := svc.Addrs()[0]
		// A forward in flight when the stop comes.
		if r := exchange(t, addr, "reviews.", dns.TypeA, "udp"); len(r.Answer) != 2 {
			t.Fatalf("run %d: %v", run, r)
		}
		serving.Stop(t)
		// What the tree's runner does when a service has stopped.
		svc.health.Report(messages.Stopped, "stopped")
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			t.Fatalf("run %d: port still bound after Serve returned: %v", run, err)
		}
		pc.Close()
	}
}

// /debug/ndsz shows the table the proxy answers from, as it published it,
// with the names it generates; 503 before it answers from any.
func TestNDSZ(t *testing.T) {
	nt := testTable("v9")
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, "127.99.0.1")}, nil)
	rec := httptest.NewRecorder()
	NDSZ(p.answering).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/ndsz", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("before the table: %d", rec.Code)
	}
	p.table.Send(nt)
	p.health.WaitLast(t, "ready", func(v messages.Health) bool { return v.State == messages.Ready })
	rec = httptest.NewRecorder()
	NDSZ(p.answering).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/ndsz", nil))
	var got ndsz
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	r := got.Table["reviews.default.svc.cluster.local"]
	want := []string{"reviews.", "reviews.alias.test.", "reviews.default.", "reviews.default.svc."}
	if got.Version != "v9" || !slices.Equal(r.AltHosts, want) || len(r.IPs) != 3 {
		t.Errorf("ndsz = %+v, reviews = %+v", got.Version, r)
	}
}
