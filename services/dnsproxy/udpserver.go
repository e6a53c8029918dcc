package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

const (
	// udpBatch is how many packets one system call reads (recvmmsg) or
	// writes (sendmmsg). Under load a reader finds many queries waiting.
	udpBatch = 16
	// udpReadSize is the largest query read, as miekg's server reads.
	udpReadSize = dns.DefaultMsgSize
	// maxUDPSockets bounds the sockets sharing a listen address.
	maxUDPSockets = 4
)

// udpServer answers DNS over UDP. It replaces miekg's server there, whose
// cost under load was mostly one read and one write system call per query
// and a goroutine per packet (scheduler wake-ups): here each of a few
// sockets bound to the same address (SO_REUSEPORT, one per CPU, so the
// kernel spreads clients over them) has one goroutine that reads queries in
// batches, answers local names and bad queries in place, and writes those
// answers in one batch. Only a forwarded query gets a goroutine, as it waits
// for upstream.
type udpServer struct {
	h     *handler
	conns []*net.UDPConn
	wg    sync.WaitGroup // readers and forwarded queries
}

// batchConn is ipv4.PacketConn or ipv6.PacketConn: recvmmsg and sendmmsg.
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// newBatchConn is c read and written in batches, as IPv6 or IPv4 by its
// local address.
func newBatchConn(c *net.UDPConn) batchConn {
	if a, ok := c.LocalAddr().(*net.UDPAddr); ok && a.IP.To4() == nil {
		return ipv6.NewPacketConn(c)
	}
	return ipv4.NewPacketConn(c)
}

// readSlots is n messages for ReadBatch, each with a buffer of size bytes
// cut from one allocation (capped, so that no read runs into the next).
func readSlots(n, size int) []ipv4.Message {
	ms := make([]ipv4.Message, n)
	buf := make([]byte, n*size)
	for i := range ms {
		ms[i].Buffers = [][]byte{buf[i*size : (i+1)*size : (i+1)*size]}
	}
	return ms
}

// listenUDP binds n UDP sockets to addr (n > 1: with SO_REUSEPORT; port 0:
// all on the port the first got).
func listenUDP(addr string, n int) ([]*net.UDPConn, error) {
	lc := net.ListenConfig{}
	if n > 1 {
		lc.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	var conns []*net.UDPConn
	for i := 0; i < n; i++ {
		pc, err := lc.ListenPacket(context.Background(), "udp", addr)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, fmt.Errorf("listen udp %s: %w", addr, err)
		}
		conns = append(conns, pc.(*net.UDPConn))
		addr = pc.LocalAddr().String()
	}
	return conns, nil
}

// udpSockets is how many sockets share a listen address: one per CPU the Go
// runtime uses.
func udpSockets() int {
	return min(runtime.GOMAXPROCS(0), maxUDPSockets)
}

// serve starts a reader per socket; errs gets a reader's failure.
func (s *udpServer) serve(errs chan<- error) {
	for _, c := range s.conns {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.read(c); err != nil {
				errs <- err
			}
		}()
	}
}

// shutdown closes the sockets and waits for the readers and for the
// forwarded queries (the handler's context is cancelled before, so they end).
func (s *udpServer) shutdown() {
	for _, c := range s.conns {
		c.Close()
	}
	s.wg.Wait()
}

// read serves one socket until it is closed: read a batch of queries,
// answer what can be answered at once, write those answers in one batch.
func (s *udpServer) read(c *net.UDPConn) error {
	bc := newBatchConn(c)
	in := readSlots(udpBatch, udpReadSize)
	out := make([]ipv4.Message, udpBatch)
	outBuf := make([][]byte, udpBatch) // per slot, reused: grown by PackBuffer when needed
	for i := range outBuf {
		outBuf[i] = make([]byte, 0, dns.MinMsgSize)
		out[i].Buffers = [][]byte{nil}
	}
	// spare is the message the next query is unpacked into: a local answer
	// is packed before the next query is read, so one message serves them
	// all; a forwarded query keeps its own.
	spare := new(dns.Msg)
	var fwd sendBatch // the forwarded queries of a read, written upstream together
	for {
		n, err := bc.ReadBatch(in, 0)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var errno syscall.Errno
			if errors.As(err, &errno) && (errno == syscall.EINTR || errno == syscall.ECONNREFUSED ||
				errno == syscall.ENOBUFS || errno == syscall.ENOMEM) {
				continue // transient
			}
			return fmt.Errorf("read udp %s: %w", c.LocalAddr(), err)
		}
		k := 0
		for i := range in[:n] {
			resp, b := s.handle(c, in[i].Buffers[0][:in[i].N], in[i].Addr, &spare, outBuf[k], &fwd)
			if b == nil {
				if resp == nil {
					continue
				}
				// PackBuffer uses the buffer when its length (not its
				// capacity) is enough.
				if b, err = resp.PackBuffer(outBuf[k][:cap(outBuf[k])]); err != nil {
					continue
				}
			}
			if cap(b) > cap(outBuf[k]) && cap(b) <= udpReadSize {
				outBuf[k] = b[:0] // keep a grown buffer, within reason
			}
			out[k].Buffers[0] = b
			out[k].Addr = in[i].Addr
			k++
		}
		fwd.flush()
		for sent := 0; sent < k; {
			m, err := bc.WriteBatch(out[sent:k], 0)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return nil
				}
				// A client that went away (or a full socket buffer)
				// costs that answer only: UDP answers may be lost.
				m = max(m, 0) + 1
			}
			sent += m
		}
		for i := range out[:k] {
			out[i].Buffers[0], out[i].Addr = nil, nil
		}
		for i := range in[:n] {
			in[i].Addr = nil
		}
	}
}

// handle returns the answer to the query in pkt, to write now: a message,
// or its bytes already written in buf (or a bigger slice); neither when the
// query is dropped or forwarded (then the upstream's reader or a goroutine
// writes the answer). It filters as miekg's server does before its handler
// runs.
func (s *udpServer) handle(c *net.UDPConn, pkt []byte, addr net.Addr, spare **dns.Msg, buf []byte, fwd *sendBatch) (*dns.Msg, []byte) {
	if len(pkt) < 12 {
		return nil, nil // not even a header: no answer, it could amplify
	}
	var hdr dns.MsgHdr
	hdr.Id = binary.BigEndian.Uint16(pkt)
	bits := binary.BigEndian.Uint16(pkt[2:])
	if bits&0x8000 != 0 {
		return nil, nil // a response: never answer an answer
	}
	hdr.Opcode = int(bits>>11) & 0xf
	switch {
	case hdr.Opcode != dns.OpcodeQuery && hdr.Opcode != dns.OpcodeNotify:
		return headerReply(hdr, dns.RcodeNotImplemented), nil
	case binary.BigEndian.Uint16(pkt[4:]) != 1, binary.BigEndian.Uint16(pkt[6:]) > 1,
		binary.BigEndian.Uint16(pkt[8:]) > 1, binary.BigEndian.Uint16(pkt[10:]) > 2:
		return headerReply(hdr, dns.RcodeFormatError), nil
	}
	// The common query is answered or forwarded from its bytes; the rest
	// is unpacked.
	if w, ok := parseQuery(pkt); ok {
		b, forward := s.h.answerWire(&w, buf)
		if b != nil {
			return nil, b
		}
		if forward && s.forwardAsync(c, addr, pkt, w.id, w.size, fwd) {
			s.h.metrics.requests.Inc()
			return nil, nil
		}
	}
	req := *spare
	*req = dns.Msg{}
	if err := req.Unpack(pkt); err != nil {
		return headerReply(hdr, dns.RcodeFormatError), nil
	}
	resp, size, done := s.h.answerLocal(req, false)
	if done {
		return resp, nil
	}
	if s.forwardAsync(c, addr, pkt, req.Id, size, fwd) {
		return nil, nil
	}
	*spare = new(dns.Msg) // req goes on with the forward
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		resp, raw := s.h.answerForwarded(req, false, size)
		writeAnswer(c, addr, resp, raw)
	}()
	return nil, nil
}

// headerReply is the error answer to a query that could not be read past
// its header, as miekg's server gives it: FORMERR (or NOTIMP, with the
// query's opcode), nothing but the header.
func headerReply(hdr dns.MsgHdr, rcode int) *dns.Msg {
	resp := new(dns.Msg)
	resp.Id = hdr.Id
	resp.Response = true
	resp.Rcode = rcode
	if rcode == dns.RcodeNotImplemented {
		resp.Opcode = hdr.Opcode
	}
	return resp
}

// forwardAsync forwards the query in pkt to the first nameserver over UDP
// with no goroutine waiting: the upstream socket's reader relays the answer
// to the client. Whatever is not that simple (a failure, to try the next
// nameserver; a truncated answer, to fetch over TCP; one too big for the
// client) goes on in a goroutine, the slow way. False when the query must
// take the slow way from the start (parallel nameservers, none at all).
func (s *udpServer) forwardAsync(c *net.UDPConn, addr net.Addr, pkt []byte, id uint16, size int, fwd *sendBatch) bool {
	f := s.h.fwd
	if len(f.servers) == 0 || (f.parallel && len(f.servers) > 1) {
		return false
	}
	query := append([]byte(nil), pkt...) // pkt's buffer is read into again
	q, ok := questionOf(query)
	if !ok {
		return false
	}
	u := f.servers[0]
	start := time.Now()
	f.metrics.upstreamRequests.Inc()
	s.wg.Add(1)
	w := &waiter{q: q, deadline: start.Add(f.timeout)}
	w.done = func(resp []byte, err error, relay *relayBatch) {
		defer s.wg.Done()
		if err == nil && resp[2]&0x02 == 0 && len(resp) <= size {
			f.metrics.upstreamDuration.Observe(time.Since(start).Seconds())
			binary.BigEndian.PutUint16(resp, id)
			if relay != nil {
				relay.add(c, resp, addr) // written with the others of its read
			} else {
				_, _ = c.WriteTo(resp, addr)
			}
			return
		}
		if s.h.ctx.Err() != nil {
			return // shutting down
		}
		if resp != nil {
			resp = append([]byte(nil), resp...) // valid only during this call
		}
		s.wg.Add(1) // before the Done above: shutdown waits for it too
		go func() {
			defer s.wg.Done()
			s.finishForward(c, addr, id, query, q, size, start, resp, err)
		}()
	}
	fwd.socket(u)
	if err := fwd.add(query, w); err != nil {
		w.done(nil, err, nil)
	}
	return true
}

// finishForward is the slow way of forwardAsync's query (id: the client's
// ID), given the first nameserver's UDP answer resp (truncated, or too big
// for the client) or its failure err.
func (s *udpServer) finishForward(c *net.UDPConn, addr net.Addr, id uint16, query, q []byte, size int,
	start time.Time, resp []byte, err error,
) {
	f := s.h.fwd
	// A copy of the query with the client's ID, never reading query's own
	// ID: the batch writes the upstream's there, unsynchronised with a
	// failure delivered by the sweeper. It is unpacked only now, on this
	// rare way (#24: the common query is never unpacked); its bytes passed
	// miekg's unpacking or parseQuery's stricter reading already.
	query = append([]byte{byte(id >> 8), byte(id)}, query[2:]...)
	req := new(dns.Msg)
	if err := req.Unpack(query); err != nil {
		return
	}
	defer func() { f.metrics.upstreamDuration.Observe(time.Since(start).Seconds()) }()
	switch {
	case err != nil:
		f.log.Debug("upstream failed", "upstream", f.servers[0].addr, "error", err)
		resp = nil
		if len(f.servers) > 1 {
			resp = f.exchange(s.h.ctx, query, q, false, 1)
		}
	case resp[2]&0x02 != 0:
		// Truncated: the whole answer over TCP, and the client's size
		// decides whether it must come back over TCP.
		if full, err := f.servers[0].exchangeTCP(s.h.ctx, query, q); err == nil {
			resp = full
		}
	}
	if resp == nil {
		f.metrics.upstreamFailures.Inc()
	} else {
		binary.BigEndian.PutUint16(resp, req.Id)
	}
	msg, raw := fitAnswer(req, size, resp)
	writeAnswer(c, addr, msg, raw)
}

// writeAnswer sends a forwarded query's answer (fitAnswer's) to the client
// at addr: raw as it is when the upstream's bytes could be passed on, else
// msg packed. A msg that does not pack sends nothing: the client asks again.
func writeAnswer(c *net.UDPConn, addr net.Addr, msg *dns.Msg, raw []byte) {
	if raw == nil && msg != nil {
		var err error
		if raw, err = msg.Pack(); err != nil {
			return
		}
	}
	if raw != nil {
		_, _ = c.WriteTo(raw, addr)
	}
}
