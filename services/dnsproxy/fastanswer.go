package dnsproxy

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"

	"github.com/miekg/dns"
)

// Header bits of a local answer (RFC 1035 4.1.1), as miekg packs them.
const (
	bitQR = 1 << 15
	bitAA = 1 << 10
	bitRD = 1 << 8
	bitCD = 1 << 4
)

// maxWireAddrs is the most addresses answerWire shuffles on the stack; a
// host with more takes the message path.
const maxWireAddrs = 16

// answerWire writes the answer to req straight into buf (grown when too
// small) when it is the common one: a UDP query of class IN for the A or
// AAAA records of a name of the table (or under one of its wildcards),
// not a search expansion, fitting the client's size. The bytes are those
// miekg packs for answerLocal's message (TestAnswerWireIsPacked), without
// building the records and the message and walking them to pack (#24: the
// mesh-name path). pkt is the query as it came, req the same unpacked:
// the question is copied from pkt, and the owner name too, in lower case
// (packing the names took a tenth of the path's CPU under dnsperf). false:
// take answerLocal's way; nothing was counted.
func (h *handler) answerWire(req *dns.Msg, pkt, buf []byte) ([]byte, bool) {
	if req.Response || req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		return nil, false
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET || (q.Qtype != dns.TypeA && q.Qtype != dns.TypeAAAA) {
		return nil, false
	}
	t := h.table.Load()
	if t == nil {
		return nil, false
	}
	name := strings.ToLower(q.Name) // no allocation when already lower case
	m := t.lookup(name)
	n := 0
	if m.host != nil {
		n = m.host.count(q.Qtype)
	}
	if m.host == nil || m.cname || n > maxWireAddrs {
		return nil, false
	}
	size := dns.MinMsgSize
	opt := req.IsEdns0()
	if opt != nil && int(opt.UDPSize()) > size {
		size = int(opt.UDPSize())
	}
	raw, ok := questionOf(pkt) // name (no compression), type, class
	if !ok {
		return nil, false
	}
	rawName := raw[:len(raw)-4]
	rdlen := 4
	if q.Qtype == dns.TypeAAAA {
		rdlen = 16
	}
	need := 12 + len(raw) + n*(len(rawName)+10+rdlen) + 11
	if need > size+11 {
		return nil, false // to be truncated: the message path does it
	}
	if cap(buf) < need {
		buf = make([]byte, need)
	}
	b := buf[:cap(buf)]

	binary.BigEndian.PutUint16(b[0:], req.Id)
	bits := uint16(bitQR|bitAA) | uint16(req.Opcode&0xf)<<11
	if req.RecursionDesired {
		bits |= bitRD
	}
	if req.CheckingDisabled {
		bits |= bitCD
	}
	binary.BigEndian.PutUint16(b[2:], bits)
	binary.BigEndian.PutUint16(b[4:], 1)
	binary.BigEndian.PutUint16(b[6:], uint16(n))
	binary.BigEndian.PutUint16(b[8:], 0)
	arcount := uint16(0)
	if opt != nil {
		arcount = 1
	}
	binary.BigEndian.PutUint16(b[10:], arcount)
	off := 12 + copy(b[12:], raw)
	// The owner is the query's name in lower case: its label bytes
	// lowered, never its length bytes (miekg packs strings.ToLower of the
	// name, which changes A-Z alone: other bytes are escaped).
	owner := 0

	// The addresses in a random order (DNS round robin), as records()
	// shuffles them.
	var order [maxWireAddrs]uint16
	for i := range n {
		order[i] = uint16(i)
	}
	for i := n - 1; i > 0; i-- {
		j := rand.IntN(i + 1)
		order[i], order[j] = order[j], order[i]
	}
	for _, k := range order[:n] {
		if owner == 0 {
			owner = off
			off += copy(b[off:], rawName)
			lowerName(b[owner:off])
		} else {
			off += copy(b[off:], b[owner:owner+len(rawName)])
		}
		binary.BigEndian.PutUint16(b[off:], q.Qtype)
		binary.BigEndian.PutUint16(b[off+2:], dns.ClassINET)
		binary.BigEndian.PutUint32(b[off+4:], ttl)
		binary.BigEndian.PutUint16(b[off+8:], uint16(rdlen))
		off += 10
		if q.Qtype == dns.TypeA {
			off += copy(b[off:], t.v4(m.host, int(k)))
		} else {
			off += copy(b[off:], t.v6(m.host, int(k)))
		}
	}
	if opt != nil {
		// localReply's OPT: root name, our size, no extended rcode, no
		// flags, no options.
		b[off] = 0
		binary.BigEndian.PutUint16(b[off+1:], dns.TypeOPT)
		binary.BigEndian.PutUint16(b[off+3:], dns.DefaultMsgSize)
		binary.BigEndian.PutUint32(b[off+5:], 0)
		binary.BigEndian.PutUint16(b[off+9:], 0)
		off += 11
	}
	if off > size {
		return nil, false // to be truncated: the message path does it
	}
	h.metrics.requests.Inc()
	h.metrics.localAnswers.Inc()
	return b[:off], true
}

// lowerName lowers the ASCII letters of the labels of a wire-format name
// (no compression), leaving the length bytes alone.
func lowerName(name []byte) {
	for i := 0; i < len(name) && name[i] != 0; {
		l := int(name[i])
		for j := i + 1; j <= i+l && j < len(name); j++ {
			name[j] = lower(name[j])
		}
		i += 1 + l
	}
}
