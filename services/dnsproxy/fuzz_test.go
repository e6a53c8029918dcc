package dnsproxy

import (
	"context"
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
