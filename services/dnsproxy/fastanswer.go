package dnsproxy

import (
	"encoding/binary"
	"math/rand/v2"

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

// wireQuery is a query read from its bytes without miekg, when it is the
// common one (parseQuery): what answerWire and the forwarder need of it.
type wireQuery struct {
	id    uint16
	bits  uint16 // the header's flags
	q     []byte // the question section (name, type, class), in the packet
	qtype uint16
	// name is the question's name as the table keys it: lower case,
	// presentation format, fully qualified.
	name string
	opt  bool // an OPT record (without options) came with it
	size int  // the largest UDP answer the client takes
}

// parseQuery reads pkt when it is the common query: opcode QUERY, one
// question of class IN whose name has no compression and no byte miekg
// would escape, nothing else but an OPT record without options, and not a
// byte more. Anything else (false) takes the message path, where miekg
// unpacks it and decides what it is. Unpacking every query was a tenth of
// the mesh path's CPU and most of its allocations (#24).
func parseQuery(pkt []byte) (wireQuery, bool) {
	if len(pkt) < 12 {
		return wireQuery{}, false
	}
	w := wireQuery{id: binary.BigEndian.Uint16(pkt), bits: binary.BigEndian.Uint16(pkt[2:])}
	if w.bits&bitQR != 0 || (w.bits>>11)&0xf != dns.OpcodeQuery || binary.BigEndian.Uint16(pkt[4:]) != 1 ||
		binary.BigEndian.Uint16(pkt[6:]) != 0 || binary.BigEndian.Uint16(pkt[8:]) != 0 {
		return wireQuery{}, false
	}
	arcount := binary.BigEndian.Uint16(pkt[10:])
	q, ok := questionOf(pkt)
	if !ok || arcount > 1 || binary.BigEndian.Uint16(q[len(q)-2:]) != dns.ClassINET {
		return wireQuery{}, false
	}
	w.q, w.qtype, w.size = q, binary.BigEndian.Uint16(q[len(q)-4:]), dns.MinMsgSize
	rest := pkt[12+len(q):]
	if arcount == 1 {
		// The OPT record: root name, type, the client's size as the class,
		// TTL (extended rcode, version, flags), no options.
		if len(rest) != 11 || rest[0] != 0 || binary.BigEndian.Uint16(rest[1:]) != dns.TypeOPT ||
			binary.BigEndian.Uint16(rest[9:]) != 0 {
			return wireQuery{}, false
		}
		w.opt = true
		w.size = max(w.size, int(binary.BigEndian.Uint16(rest[3:])))
	} else if len(rest) != 0 {
		return wireQuery{}, false
	}
	// The name as miekg would unpack it, lowered; what it would escape,
	// or refuse as too long, it unpacks.
	var name [256]byte
	n, budget := 0, 255
	raw := q[:len(q)-4]
	for i := 0; raw[i] != 0; {
		l := int(raw[i])
		if budget -= l + 1; budget <= 0 {
			return wireQuery{}, false
		}
		for _, b := range raw[i+1 : i+1+l] {
			if b <= ' ' || b > '~' || isDomainNameLabelSpecial(b) {
				return wireQuery{}, false
			}
			name[n] = lower(b)
			n++
		}
		name[n] = '.'
		n++
		i += 1 + l
	}
	if n == 0 {
		name[0], n = '.', 1
	}
	w.name = string(name[:n])
	return w, true
}

// isDomainNameLabelSpecial is miekg's: the bytes it escapes with a
// backslash in a name.
func isDomainNameLabelSpecial(b byte) bool {
	switch b {
	case '.', ' ', '\'', '@', ';', '(', ')', '"', '\\':
		return true
	}
	return false
}

// answerWire writes the answer to w straight into buf (grown when too
// small) when it is the common one: the A or AAAA records of a name of the
// table (or under one of its wildcards), not a search expansion, fitting
// the client's size. The bytes are those miekg packs for answerLocal's
// message (TestAnswerWireIsPacked), without building the records and the
// message and walking them to pack (#24: the mesh-name path). The question
// is copied from the query, and the owner name too, in lower case (packing
// the names took a tenth of the path's CPU under dnsperf). No answer:
// forward tells whether upstream answers w (the table does not know the
// name for that type) or the message path must (nothing was counted).
func (h *handler) answerWire(w *wireQuery, buf []byte) (_ []byte, forward bool) {
	if w.qtype != dns.TypeA && w.qtype != dns.TypeAAAA {
		return nil, true
	}
	t := h.table.Load()
	if t == nil {
		return nil, true
	}
	m := t.lookup(w.name)
	if m.host == nil {
		return nil, true
	}
	n := m.host.count(w.qtype)
	if m.cname || n > maxWireAddrs {
		return nil, false
	}
	raw := w.q
	rawName := raw[:len(raw)-4]
	rdlen := 4
	if w.qtype == dns.TypeAAAA {
		rdlen = 16
	}
	need := 12 + len(raw) + n*(len(rawName)+10+rdlen) + 11
	if need > w.size+11 {
		return nil, false // to be truncated: the message path does it
	}
	if cap(buf) < need {
		buf = make([]byte, need)
	}
	b := buf[:cap(buf)]

	binary.BigEndian.PutUint16(b[0:], w.id)
	binary.BigEndian.PutUint16(b[2:], uint16(bitQR|bitAA)|w.bits&(0xf<<11|bitRD|bitCD))
	binary.BigEndian.PutUint16(b[4:], 1)
	binary.BigEndian.PutUint16(b[6:], uint16(n))
	binary.BigEndian.PutUint16(b[8:], 0)
	arcount := uint16(0)
	if w.opt {
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
		binary.BigEndian.PutUint16(b[off:], w.qtype)
		binary.BigEndian.PutUint16(b[off+2:], dns.ClassINET)
		binary.BigEndian.PutUint32(b[off+4:], ttl)
		binary.BigEndian.PutUint16(b[off+8:], uint16(rdlen))
		off += 10
		if w.qtype == dns.TypeA {
			off += copy(b[off:], t.v4(m.host, int(k)))
		} else {
			off += copy(b[off:], t.v6(m.host, int(k)))
		}
	}
	if w.opt {
		// localReply's OPT: root name, our size, no extended rcode, no
		// flags, no options.
		b[off] = 0
		binary.BigEndian.PutUint16(b[off+1:], dns.TypeOPT)
		binary.BigEndian.PutUint16(b[off+3:], dns.DefaultMsgSize)
		binary.BigEndian.PutUint32(b[off+5:], 0)
		binary.BigEndian.PutUint16(b[off+9:], 0)
		off += 11
	}
	if off > w.size {
		return nil, false // to be truncated: the message path does it
	}
	h.metrics.requests.Inc()
	h.metrics.localAnswers.Inc()
	return b[:off], false
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
