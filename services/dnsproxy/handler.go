package dnsproxy

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync/atomic"

	"github.com/miekg/dns"
)

// handler answers one query: from the lookup table when it knows the name,
// from upstream otherwise. It is safe for concurrent use; the table is
// swapped atomically under running queries.
type handler struct {
	ctx     context.Context // the run's: cancelled first at shutdown, so forwards end
	table   atomic.Pointer[lookupTable]
	fwd     *forwarder
	metrics *metrics
	log     *slog.Logger
}

// ServeDNS implements dns.Handler.
func (h *handler) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	_, tcp := w.LocalAddr().(*net.TCPAddr)
	resp, raw := h.answer(req, tcp)
	switch {
	case raw != nil:
		_, _ = w.Write(raw)
	case resp != nil:
		_ = w.WriteMsg(resp)
	}
}

// answer returns the response to req, either as a message or, relayed from
// upstream, as wire bytes; neither to drop it. It may reuse req as the
// response.
func (h *handler) answer(req *dns.Msg, tcp bool) (*dns.Msg, []byte) {
	resp, size, done := h.answerLocal(req, tcp)
	if done {
		return resp, nil
	}
	return h.answerForwarded(req, tcp, size)
}

// answerLocal answers what needs no upstream: local names and bad queries
// (done; a nil response drops the query). Otherwise it returns the size the
// forwarded answer must fit in. It never blocks, so the UDP server runs it
// in the goroutine that read the packet.
func (h *handler) answerLocal(req *dns.Msg, tcp bool) (resp *dns.Msg, size int, done bool) {
	h.metrics.requests.Inc()
	if req.Response {
		return nil, 0, true // never answer an answer: no reflection loops
	}
	if req.Opcode != dns.OpcodeQuery {
		return errorReply(req, dns.RcodeNotImplemented), 0, true
	}
	if len(req.Question) != 1 {
		// Istio answers SERVFAIL to an empty question; FORMERR is what it
		// is (and what miekg's server answers before we see it).
		return errorReply(req, dns.RcodeFormatError), 0, true
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET {
		return errorReply(req, dns.RcodeRefused), 0, true
	}
	size = dns.MaxMsgSize
	opt := req.IsEdns0()
	if !tcp {
		size = dns.MinMsgSize
		if opt != nil && int(opt.UDPSize()) > size {
			size = int(opt.UDPSize())
		}
	}
	if q.Qtype == dns.TypeA || q.Qtype == dns.TypeAAAA {
		if t := h.table.Load(); t != nil {
			name := strings.ToLower(q.Name) // no allocation when already lower case
			if m := t.lookup(name); m.host != nil {
				h.metrics.localAnswers.Inc()
				resp := localReply(req, opt)
				resp.Answer = t.records(m, q.Qtype, name)
				if !tcp {
					resp.Truncate(size)
				}
				return resp, size, true
			}
		}
	}
	return nil, size, false
}

// answerForwarded is upstream's answer to req, to fit in size bytes.
func (h *handler) answerForwarded(req *dns.Msg, tcp bool, size int) (*dns.Msg, []byte) {
	// Not a name of the mesh (or not yet a table, or another type):
	// upstream answers. Before the first table Istio answers SERVFAIL; we
	// forward, so that a workload starting before the control plane answers
	// still resolves everything the cluster's DNS knows.
	return fitAnswer(req, size, h.fwd.forward(h.ctx, req, tcp))
}

// fitAnswer is upstream's answer raw (with the query's ID), relayed as it
// is when it fits in size, else decoded and truncated; SERVFAIL for none.
func fitAnswer(req *dns.Msg, size int, raw []byte) (*dns.Msg, []byte) {
	if raw == nil {
		return errorReply(req, dns.RcodeServerFailure), nil
	}
	if len(raw) <= size {
		return nil, raw
	}
	// Too big for the client (a TCP answer to a UDP client): decode and
	// truncate, so that the client retries over TCP.
	resp := new(dns.Msg)
	if err := resp.Unpack(raw); err != nil {
		return errorReply(req, dns.RcodeServerFailure), nil
	}
	resp.Truncate(size)
	return resp, nil
}

// records returns the answer records of m for qtype, made for this answer
// (the table holds addresses, not records): a CNAME first for a search
// expansion, then the addresses, named after the owner, shuffled. A known
// name without records of the family is NODATA (empty, NOERROR), never
// NXDOMAIN: clients asking A and AAAA in parallel would take an NXDOMAIN
// for the whole name (istio/istio#31250).
func (t *lookupTable) records(m match, qtype uint16, name string) []dns.RR {
	n := m.host.count(qtype)
	if n == 0 {
		return nil
	}
	first := 0
	if m.cname {
		first = 1
	}
	out := make([]dns.RR, first, first+n)
	if m.cname {
		out[0] = &dns.CNAME{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: ttl}, Target: m.owner}
	}
	hdr := dns.RR_Header{Name: m.owner, Rrtype: qtype, Class: dns.ClassINET, Ttl: ttl}
	if qtype == dns.TypeA {
		recs := make([]dns.A, n)
		for i := range recs {
			recs[i] = dns.A{Hdr: hdr, A: t.v4(m.host, i)}
			out = append(out, &recs[i])
		}
	} else {
		recs := make([]dns.AAAA, n)
		for i := range recs {
			recs[i] = dns.AAAA{Hdr: hdr, AAAA: t.v6(m.host, i)}
			out = append(out, &recs[i])
		}
	}
	shuffle(out[first:])
	return out
}

// shuffle permutes address records so that clients spread over them (DNS
// round robin, as kube-dns and Istio do).
func shuffle(rrs []dns.RR) {
	for i := len(rrs) - 1; i > 0; i-- {
		j := rand.IntN(i + 1)
		rrs[i], rrs[j] = rrs[j], rrs[i]
	}
}

// localReply turns req into the authoritative reply to itself, in place,
// without allocating: the request is ours and not used after. RA stays
// clear, as in Istio's replies (dns.Msg.SetReply, which never sets it):
// the differential against Istio's agent on a real istiod found the
// difference.
func localReply(req *dns.Msg, opt *dns.OPT) *dns.Msg {
	req.Response = true
	req.Authoritative = true
	req.RecursionAvailable = false
	req.Truncated = false
	req.AuthenticatedData = false
	req.Zero = false
	req.Rcode = dns.RcodeSuccess
	req.Question = req.Question[:1]
	req.Answer, req.Ns = nil, nil
	if opt != nil {
		// The query's own OPT record becomes the answer's (miekg writes
		// the rcode into it when packing, so it cannot be shared): our
		// size, no flags, no options echoed.
		opt.Hdr.Name, opt.Hdr.Ttl, opt.Option = ".", 0, nil
		opt.SetUDPSize(dns.DefaultMsgSize)
		req.Extra = append(req.Extra[:0], opt)
	} else {
		req.Extra = nil
	}
	return req
}

// errorReply is Istio's error reply (SetRcode, RA clear). A forwarded
// answer keeps upstream's flags as they were.
func errorReply(req *dns.Msg, rcode int) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetRcode(req, rcode)
	return resp
}
