package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// listenUpstream binds udp (and tcp) port 53 of a random loopback address,
// as resolv.conf names no port; it skips the test without root.
func listenUpstream(t *testing.T) (net.PacketConn, net.Listener, string) {
	t.Helper()
	for attempt := 0; attempt < 5; attempt++ {
		ip := fmt.Sprintf("127.%d.%d.%d", 100+rand.IntN(100), 1+rand.IntN(250), 1+rand.IntN(250))
		pc, err := net.ListenPacket("udp", ip+":53")
		if err != nil {
			t.Skipf("cannot bind %s:53 (root needed): %v", ip, err)
		}
		l, err := net.Listen("tcp", ip+":53")
		if err != nil {
			pc.Close()
			continue
		}
		t.Cleanup(func() { pc.Close(); l.Close() })
		return pc, l, ip
	}
	t.Fatal("no free loopback address for the upstream")
	return nil, nil, ""
}

// Queries forwarded and still unanswered when the proxy stops do not hold
// Serve until their (here: one hour) timeout: they are dropped at once.
func TestStopWithForwardsInFlight(t *testing.T) {
	up, _, ip := listenUpstream(t) // reads, never answers
	nt := testTable("v1")
	cfg := Config{Listen: "127.0.0.1:0", Namespace: "default", ResolvConf: writeResolvConf(t, ip), ForwardTimeout: time.Hour}
	svc, err := New(cfg, Inputs{Table: cellWith(nt)}, Outputs{}, messages.NewRuntime(Name, &testkit.HealthRecorder{}, nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx) }()
	for len(svc.Addrs()) == 0 {
		time.Sleep(time.Millisecond)
	}
	client, err := net.Dial("udp", svc.Addrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const queries = 20
	for i := 0; i < queries; i++ {
		pkt, _ := new(dns.Msg).SetQuestion(fmt.Sprintf("q%d.upstream.test.", i), dns.TypeA).Pack()
		if _, err := client.Write(pkt); err != nil {
			t.Fatal(err)
		}
	}
	// Every query reached the upstream: all are in flight.
	buf := make([]byte, 512)
	up.SetReadDeadline(time.Now().Add(10 * time.Second))
	for i := 0; i < queries; i++ {
		if _, _, err := up.ReadFrom(buf); err != nil {
			t.Fatalf("upstream got %d of %d queries: %v", i, queries, err)
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Serve = %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return: forwards in flight held it")
	}
}

// An upstream UDP answer bigger than the proxy's read buffer (4096 bytes)
// that does not say truncated is not relayed cut: the proxy takes it as
// truncated and fetches it whole over TCP.
func TestUpstreamAnswerBiggerThanBuffer(t *testing.T) {
	pc, l, ip := listenUpstream(t)
	var txt []string
	for i := 0; i < 24; i++ {
		txt = append(txt, strings.Repeat(string(rune('a'+i)), 250)) // ~6 KB in all
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg).SetReply(r)
		for _, s := range txt {
			m.Answer = append(m.Answer, &dns.TXT{
				Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 5},
				Txt: []string{s},
			})
		}
		_ = w.WriteMsg(m) // over UDP too: never truncated
	})
	udp := &dns.Server{PacketConn: pc, Handler: h}
	tcp := &dns.Server{Listener: l, Handler: h}
	for _, srv := range []*dns.Server{udp, tcp} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, ip)}, nil)
	q := new(dns.Msg).SetQuestion("big.upstream.test.", dns.TypeTXT)
	q.SetEdns0(65000, false)
	r, _, err := (&dns.Client{UDPSize: 65000, Timeout: 5 * time.Second}).Exchange(q, p.addr)
	if err != nil {
		t.Fatalf("over UDP: %v", err)
	}
	if r.Truncated || len(r.Answer) != len(txt) {
		t.Errorf("over UDP: truncated=%v answers=%d, want %d whole", r.Truncated, len(r.Answer), len(txt))
	}
}

func cellWith(nt messages.NameTable) *messages.Cell[messages.NameTable] {
	c := messages.NewCell[messages.NameTable]()
	c.Send(nt)
	return c
}

// Many forwarded queries at once, from several clients: each gets the
// answer to its own question, with its own ID (answers are relayed by the
// upstream sockets' readers, not by a goroutine per query).
func TestForwardedConcurrent(t *testing.T) {
	up := startDnsmasq(t)
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, up)}, nil)
	const clients, perClient = 8, 16 // in flight at once: within the default socket buffers (~200 KiB: ~250 datagrams)
	errs := make(chan error, clients)
	for c := 0; c < clients; c++ {
		go func() {
			conn, err := net.Dial("udp", p.addr)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			want := map[uint16]string{}
			for i := 0; i < perClient; i++ { // all out before any answer is read
				m := new(dns.Msg).SetQuestion(fmt.Sprintf("c%d-q%d.upstream.test.", c, i), dns.TypeA)
				m.Id = uint16(1000*c + i) // unique: random IDs could collide
				want[m.Id] = m.Question[0].Name
				pkt, _ := m.Pack()
				if _, err := conn.Write(pkt); err != nil {
					errs <- err
					return
				}
			}
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 4096)
			for len(want) > 0 {
				n, err := conn.Read(buf)
				if err != nil {
					errs <- fmt.Errorf("client %d: %d answers missing: %w", c, len(want), err)
					return
				}
				r := new(dns.Msg)
				if err := r.Unpack(buf[:n]); err != nil {
					errs <- err
					return
				}
				name, ok := want[r.Id]
				if !ok || len(r.Question) != 1 || r.Question[0].Name != name || len(r.Answer) != 1 {
					errs <- fmt.Errorf("client %d: unexpected answer %v", c, r)
					return
				}
				delete(want, r.Id)
			}
			errs <- nil
		}()
	}
	for c := 0; c < clients; c++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
