package dnsproxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/meshagent/meshagent/messages"
)

func benchHandler(b *testing.B, nt messages.NameTable) *handler {
	m := newMetrics()
	fwd := newForwarder([]string{"127.99.0.1:53"}, 50*time.Millisecond, false, m, discardLogger())
	b.Cleanup(fwd.close)
	h := &handler{ctx: context.Background(), fwd: fwd, metrics: m, log: discardLogger()}
	h.table.Store(buildTable(nt, "default", "default.svc.cluster.local", []string{"default.svc.cluster.local"}))
	return h
}

// BenchmarkLocalAnswer is one local answer the way the server runs it:
// unpack the query, answer, pack the reply. The baselines are the same
// unpack+pack with nothing looked up (miekg's floor), and Istio's way
// (fresh Msg, copied and regrouped records).
func BenchmarkLocalAnswer(b *testing.B) {
	nt := testTable("v1")
	h := benchHandler(b, nt)
	for _, c := range []struct{ name, q string }{
		{"one-A", "ratings.other."},
		{"two-A", "reviews.default.svc.cluster.local."},
		{"cname+A", "ratings.other.default.svc.cluster.local."},
		{"wildcard", "foo.wild.example.com."},
	} {
		pkt, _ := new(dns.Msg).SetQuestion(c.q, dns.TypeA).Pack()
		tbl := h.table.Load()
		recs := tbl.records(tbl.lookup(c.q), dns.TypeA, c.q)
		for _, way := range []struct {
			name   string
			answer func(b *testing.B, req *dns.Msg) *dns.Msg
		}{
			{"proxy", func(b *testing.B, req *dns.Msg) *dns.Msg {
				resp, _ := h.answer(req, false)
				if len(resp.Answer) == 0 {
					b.Fatal("no answer")
				}
				return resp
			}},
			{"istio-style", func(_ *testing.B, req *dns.Msg) *dns.Msg {
				resp := new(dns.Msg)
				resp.SetReply(req)
				resp.Authoritative = true
				resp.Answer = istioStyleRecords(tbl, req.Question[0].Name)
				roundRobinIstioStyle(resp)
				resp.Truncate(512)
				return resp
			}},
			{"floor-unpack-pack", func(_ *testing.B, req *dns.Msg) *dns.Msg {
				req.Response = true
				req.Answer = recs
				return req
			}},
		} {
			buf := make([]byte, 0, 512)
			b.Run(c.name+"/"+way.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					req := new(dns.Msg)
					if err := req.Unpack(pkt); err != nil {
						b.Fatal(err)
					}
					buf, _ = way.answer(b, req).PackBuffer(buf)
				}
			})
		}
	}
}

// istioStyleRecords copies the records per query as Istio's lookupHost
// does (dns.Copy of every CNAME and wildcard record, fresh slices).
func istioStyleRecords(t *lookupTable, name string) []dns.RR {
	var out []dns.RR
	for _, r := range t.records(t.lookup(name), dns.TypeA, name) {
		r = dns.Copy(r)
		r.Header().Name = name
		out = append(out, r)
	}
	return out
}

func roundRobinIstioStyle(m *dns.Msg) {
	cname, address, rest := make([]dns.RR, 0), make([]dns.RR, 0), make([]dns.RR, 0)
	for _, r := range m.Answer {
		switch r.Header().Rrtype {
		case dns.TypeCNAME:
			cname = append(cname, r)
		case dns.TypeA, dns.TypeAAAA:
			address = append(address, r)
		default:
			rest = append(rest, r)
		}
	}
	shuffle(address)
	m.Answer = append(append(cname, rest...), address...)
}

// bigTable is n Kubernetes services over 100 namespaces, one IPv4 and one
// IPv6 address each.
func bigTable(n int, version string) messages.NameTable {
	nt := messages.NameTable{Version: version, Hosts: make(map[string]messages.NameInfo, n)}
	for i := 0; i < n; i++ {
		ns := fmt.Sprintf("ns%d", i%100)
		name := fmt.Sprintf("svc%d", i)
		nt.Hosts[name+"."+ns+".svc.cluster.local"] = messages.NameInfo{
			IPs: []netip.Addr{
				netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}),
				netip.AddrFrom16([16]byte{0xfd, 0, 14: byte(i >> 8), 15: byte(i)}),
			},
			Registry: "Kubernetes", Shortname: name, Namespace: ns,
		}
	}
	return nt
}

// BenchmarkTableSwap10k builds the lookup table of 10,000 services and swaps
// it in, while another goroutine keeps answering queries from whichever
// table is current; every one of them must be answered.
func BenchmarkTableSwap10k(b *testing.B) {
	tables := []messages.NameTable{bigTable(10000, "a"), bigTable(10000, "b")}
	h := benchHandler(b, tables[0])
	pkt, _ := new(dns.Msg).SetQuestion("svc4242.ns42.svc.cluster.local.", dns.TypeA).Pack()
	stop := make(chan struct{})
	var answered, failed atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			req := new(dns.Msg)
			_ = req.Unpack(pkt)
			if resp, _ := h.answer(req, false); resp != nil && len(resp.Answer) == 1 {
				answered.Add(1)
			} else {
				failed.Add(1)
			}
		}
	}()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		t := buildTable(tables[i%2], "ns42", "ns42.svc.cluster.local", []string{"ns42.svc.cluster.local", "svc.cluster.local"})
		h.table.Store(t)
		i++
	}
	close(stop)
	wg.Wait()
	if failed.Load() != 0 {
		b.Fatalf("%d queries unanswered during swaps", failed.Load())
	}
	b.ReportMetric(float64(answered.Load())/float64(b.N), "queries-answered/swap")
	b.ReportMetric(float64(len(h.table.Load().names)), "names")
}

// BenchmarkForward forwards one query to a real dnsmasq: through the
// proxy's forwarder (pooled connected sockets, answers relayed as bytes),
// against Istio's way (a dns.Client.Exchange per query: a new socket each,
// answer unpacked) and against querying dnsmasq directly on one socket
// (the floor: the upstream's own cost plus one round trip).
func BenchmarkForward(b *testing.B) {
	up := startDnsmasq(b) + ":53"
	m := newMetrics()
	fwd := newForwarder([]string{up}, 5*time.Second, false, m, discardLogger())
	b.Cleanup(fwd.close)
	req := new(dns.Msg).SetQuestion("bench.upstream.test.", dns.TypeA)
	b.Run("proxy", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if raw := fwd.forward(context.Background(), req, false); raw == nil {
				b.Fatal("no answer")
			}
		}
	})
	b.Run("istio-style", func(b *testing.B) {
		b.ReportAllocs()
		c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
		for b.Loop() {
			if _, _, err := c.Exchange(req, up); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("floor-direct", func(b *testing.B) {
		b.ReportAllocs()
		c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
		conn, err := c.Dial(up)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		for b.Loop() {
			if _, _, err := c.ExchangeWithConn(req, conn); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Many in flight at once: the pool's ID matching under load.
	b.Run("proxy-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if raw := fwd.forward(context.Background(), req, false); raw == nil {
					b.Error("no answer")
					return
				}
			}
		})
	})
	b.Run("istio-style-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
			for pb.Next() {
				if _, _, err := c.Exchange(req, up); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkUDPServer is the whole UDP path of one query through the running
// service, over loopback: a client keeps burst queries in flight on one
// connected socket (as dnsperf does) and reads their answers; one op is
// one query answered. Its allocs/op are the server's per query (the
// client's reads and writes allocate nothing), its time the client's and
// the kernel's too. mesh: answered from the table; forwarded: relayed to
// dnsmasq (#24: what is left outside the kernel per query).
func BenchmarkUDPServer(b *testing.B) {
	up := startDnsmasq(b)
	nt := testTable("v1")
	p := startProxy(b, Config{ResolvConf: writeResolvConf(b, up)}, &nt)
	for _, c := range []struct{ name, q string }{
		{"mesh", "ratings.other."},
		{"forwarded", "bench.upstream.test."},
	} {
		b.Run(c.name, func(b *testing.B) {
			conn, err := net.Dial("udp", p.addr)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			const burst = 32
			var pkts [burst][]byte
			for i := range pkts {
				m := new(dns.Msg).SetQuestion(c.q, dns.TypeA)
				m.Id = uint16(i)
				pkts[i], _ = m.Pack()
			}
			buf := make([]byte, 512)
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				if n%burst == 0 {
					_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
					for _, pkt := range pkts {
						if _, err := conn.Write(pkt); err != nil {
							b.Fatal(err)
						}
					}
				}
				if _, err := conn.Read(buf); err != nil {
					b.Fatal(err)
				}
				n++
			}
			// The rest of the last burst, so that the next run starts clean.
			for ; n%burst != 0; n++ {
				_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := conn.Read(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
