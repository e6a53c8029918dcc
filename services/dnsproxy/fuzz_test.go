package dnsproxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// FuzzHandle feeds arbitrary packets to the query handler, as the server
// would after unpacking them: it must never panic, and an answer must be a
// packable reply to the same ID. Seeds: testdata/fuzz/FuzzHandle.
func FuzzHandle(f *testing.F) {
	nt := testTable("v1")
	m := newMetrics()
	// Nothing listens upstream: forwards fail fast (ICMP) or time out.
	fwd := newForwarder([]string{"127.99.0.1:53"}, 50*time.Millisecond, false, m, discardLogger())
	f.Cleanup(fwd.close)
	h := &handler{ctx: context.Background(), fwd: fwd, metrics: m, log: discardLogger()}
	h.table.Store(buildTable(nt, "default", "default.svc.cluster.local", []string{"default.svc.cluster.local"}))
	for _, q := range []*dns.Msg{
		new(dns.Msg).SetQuestion("reviews.", dns.TypeA),
		new(dns.Msg).SetQuestion("foo.wild.example.com.default.svc.cluster.local.", dns.TypeAAAA),
		new(dns.Msg).SetQuestion("many.example.com.", dns.TypeA).SetEdns0(1232, true),
	} {
		b, _ := q.Pack()
		f.Add(b, false)
	}
	f.Fuzz(func(t *testing.T, pkt []byte, tcp bool) {
		req := new(dns.Msg)
		if err := req.Unpack(pkt); err != nil {
			return // the server drops or FORMERRs these before the handler
		}
		id := req.Id
		resp, raw := h.answer(req, tcp)
		if raw != nil {
			t.Fatalf("a relayed answer from a dead upstream: %x", raw)
		}
		if resp == nil {
			return
		}
		if resp.Id != id || !resp.Response {
			t.Fatalf("answer id=%d response=%v to query id=%d", resp.Id, resp.Response, id)
		}
		b, err := resp.Pack()
		if err != nil {
			t.Fatalf("answer does not pack: %v\n%v", err, resp)
		}
		if !tcp && len(b) > dns.MaxMsgSize {
			t.Fatalf("UDP answer of %d bytes", len(b))
		}
	})
}

// FuzzParseQuery: a query parseQuery reads from its bytes is one miekg
// unpacks to the same thing (#24: the common query is no longer unpacked,
// so the two must never disagree on what it asks).
func FuzzParseQuery(f *testing.F) {
	for _, q := range []*dns.Msg{
		new(dns.Msg).SetQuestion("reviews.", dns.TypeA),
		new(dns.Msg).SetQuestion("Ratings.OTHER.svc.", dns.TypeAAAA),
		new(dns.Msg).SetQuestion(".", dns.TypeNS),
		new(dns.Msg).SetQuestion(`a\.b\032c\(d.example.`, dns.TypeA),
		new(dns.Msg).SetQuestion("many.example.com.", dns.TypeA).SetEdns0(1232, true),
		new(dns.Msg).SetQuestion("small.example.com.", dns.TypeA).SetEdns0(100, false),
	} {
		b, _ := q.Pack()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, pkt []byte) {
		w, ok := parseQuery(pkt)
		if !ok {
			return
		}
		req := new(dns.Msg)
		if err := req.Unpack(pkt); err != nil {
			t.Fatalf("parseQuery read %x, miekg does not: %v", pkt, err)
		}
		size := dns.MinMsgSize
		opt := req.IsEdns0()
		if opt != nil && int(opt.UDPSize()) > size {
			size = int(opt.UDPSize())
		}
		if req.Response || req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 || len(req.Answer)+len(req.Ns) != 0 ||
			req.Id != w.id || req.RecursionDesired != (w.bits&bitRD != 0) || req.CheckingDisabled != (w.bits&bitCD != 0) ||
			req.Question[0].Qclass != dns.ClassINET || req.Question[0].Qtype != w.qtype ||
			strings.ToLower(req.Question[0].Name) != w.name || (opt != nil) != w.opt || (opt != nil && len(opt.Option) != 0) ||
			size != w.size {
			t.Fatalf("parseQuery %+v, miekg %v", w, req)
		}
	})
}
