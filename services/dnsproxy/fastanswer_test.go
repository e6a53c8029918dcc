package dnsproxy

import (
	"bytes"
	"slices"
	"testing"

	"github.com/miekg/dns"
)

// The answer written straight to the wire is, byte for byte, the one miekg
// packs from answerLocal's message (addresses compared as a set where a host
// has several, as both shuffle them); what it does not handle falls back.
func TestAnswerWireIsPacked(t *testing.T) {
	h := &handler{metrics: newMetrics()}
	h.table.Store(buildTable(testTable("v1"), "default", "default.svc.cluster.local", []string{"default.svc.cluster.local"}))
	query := func(name string, qtype uint16, edns int, rd, cd bool) *dns.Msg {
		m := new(dns.Msg).SetQuestion(name, qtype)
		m.Id = 0xbeef
		m.RecursionDesired, m.CheckingDisabled = rd, cd
		if edns > 0 {
			m.SetEdns0(uint16(edns), true)
		}
		return m
	}
	type want int
	const (
		wire want = iota
		fallback
	)
	for _, c := range []struct {
		name  string
		qtype uint16
		want  want
	}{
		{"ratings.other.", dns.TypeA, wire},
		{"Ratings.OTHER.svc.", dns.TypeA, wire},
		{"reviews.", dns.TypeA, wire},
		{"reviews.default.svc.cluster.local.", dns.TypeAAAA, wire},
		{"v6only.default.", dns.TypeAAAA, wire},
		{"v6only.default.", dns.TypeA, wire}, // NODATA
		{"foo.Wild.example.com.", dns.TypeA, wire},
		{"external.example.com.", dns.TypeA, wire},
		{"many.example.com.", dns.TypeA, fallback},                        // more addresses than it shuffles
		{"ratings.other.default.svc.cluster.local.", dns.TypeA, fallback}, // search expansion: CNAME
		{"unknown.example.org.", dns.TypeA, fallback},
		{"ratings.other.", dns.TypeMX, fallback},
	} {
		for _, edns := range []int{0, 512, 1232, 4096} {
			for _, bits := range [][2]bool{{true, false}, {false, true}} {
				q := query(c.name, c.qtype, edns, bits[0], bits[1])
				pkt, err := q.Pack()
				if err != nil {
					t.Fatal(err)
				}
				req := new(dns.Msg)
				if err := req.Unpack(pkt); err != nil {
					t.Fatal(err)
				}
				var got []byte
				if w, ok := parseQuery(pkt); ok {
					got, _ = h.answerWire(&w, make([]byte, 0, 16))
				}
				ok := got != nil
				if c.want == fallback {
					if ok {
						t.Errorf("%s %s: answered on the wire, want the message path", c.name, dns.TypeToString[c.qtype])
					}
					continue
				}
				if !ok {
					t.Errorf("%s %s edns %d: not answered on the wire", c.name, dns.TypeToString[c.qtype], edns)
					continue
				}
				resp, _, done := h.answerLocal(req, false)
				if !done || resp == nil {
					t.Fatalf("%s: no local answer", c.name)
				}
				packed, err := resp.Pack()
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.Answer) < 2 {
					if !bytes.Equal(got, packed) {
						t.Errorf("%s %s edns %d rd/cd %v:\nwire   %x\npacked %x", c.name, dns.TypeToString[c.qtype], edns, bits, got, packed)
					}
					continue
				}
				a, b := new(dns.Msg), new(dns.Msg)
				if err := a.Unpack(got); err != nil {
					t.Fatalf("%s: wire answer does not unpack: %v", c.name, err)
				}
				_ = b.Unpack(packed)
				if len(got) != len(packed) || a.MsgHdr != b.MsgHdr || !slices.Equal(sortedRRs(a.Answer), sortedRRs(b.Answer)) {
					t.Errorf("%s %s: wire %v\npacked %v", c.name, dns.TypeToString[c.qtype], a, b)
				}
			}
		}
	}
}

func sortedRRs(rrs []dns.RR) []string {
	out := make([]string, len(rrs))
	for i, r := range rrs {
		out[i] = r.String()
	}
	slices.Sort(out)
	return out
}
