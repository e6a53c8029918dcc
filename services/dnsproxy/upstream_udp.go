package dnsproxy

// The upstream's UDP side: a few connected sockets per nameserver, each
// shared by many queries matched to their answers by ID and question, read
// in batches (recvmmsg). Split from upstream.go (the forwarder and TCP) by
// purpose (#26).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// udpConn is one connected UDP socket to an upstream, shared by many
// queries: each gets a random free ID and waits for the answer with that ID
// and its question. The socket is dialled on first use and after a failure.
type udpConn struct {
	u       *upstream
	mu      sync.Mutex
	conn    *net.UDPConn
	closed  bool
	waiters map[uint16]*waiter
}

// waiter is one query waiting for its answer on a udpConn.
type waiter struct {
	q []byte // the question section, as sent
	// done gets the answer (valid only during the call) or the error,
	// once, from the socket's reader, its sweeper or close. It must not
	// block. From the reader it also gets the batch of answers the reader
	// writes to clients after its read (relay may keep resp in it); from
	// the others, nil.
	done func(resp []byte, err error, relay *relayBatch)
	// deadline, when set, is when the sweeper fails the query (the queries
	// no goroutine waits for, which have no timer of their own).
	deadline time.Time
}

type udpResult struct {
	resp []byte
	err  error
}

func (c *udpConn) exchange(ctx context.Context, query, q []byte) ([]byte, error) {
	ch := make(chan udpResult, 1) // buffered: done never blocks
	w := &waiter{q: q, done: func(resp []byte, err error, _ *relayBatch) {
		if resp != nil {
			resp = append([]byte(nil), resp...)
		}
		ch <- udpResult{resp, err}
	}}
	id, err := c.send(query, w)
	if err != nil {
		return nil, err
	}
	defer c.unregister(id, w)
	timer := time.NewTimer(c.u.f.timeout)
	defer timer.Stop()
	select {
	case r := <-ch:
		return r.resp, r.err
	case <-timer.C:
		return nil, fmt.Errorf("udp %s: %w", c.u.addr, context.DeadlineExceeded)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.u.f.ctx.Done():
		return nil, errClosed
	}
}

// send registers w and writes the query to the socket with w's ID, which
// it returns. Unless it returns an error, w.done is called exactly once
// (maybe before send returns); with an error, never.
func (c *udpConn) send(query []byte, w *waiter) (uint16, error) {
	conn, id, err := c.register(w)
	if err != nil {
		return 0, err
	}
	// The ID goes in a copy: query is the caller's, maybe shared.
	var small [512]byte
	buf := append(small[:0], query...)
	binary.BigEndian.PutUint16(buf, id)
	if _, err := conn.Write(buf); err != nil {
		if !c.unregister(id, w) {
			return id, nil // failed meanwhile (socket closed): done has it
		}
		return 0, fmt.Errorf("udp %s: %w", c.u.addr, err)
	}
	return id, nil
}

// register dials the socket if needed and gives w a free ID.
func (c *udpConn) register(w *waiter) (*net.UDPConn, uint16, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, 0, errClosed
	}
	if c.conn == nil {
		raddr, err := net.ResolveUDPAddr("udp", c.u.addr)
		if err != nil {
			return nil, 0, fmt.Errorf("udp %s: %w", c.u.addr, err)
		}
		conn, err := net.DialUDP("udp", nil, raddr)
		if err != nil {
			return nil, 0, fmt.Errorf("udp %s: %w", c.u.addr, err)
		}
		c.conn = conn
		c.waiters = make(map[uint16]*waiter)
		c.u.f.wg.Add(2)
		go c.read(conn)
		go c.sweep(conn)
	}
	if len(c.waiters) >= maxInFlightPerConn {
		return nil, 0, fmt.Errorf("udp %s: %w", c.u.addr, errTooMany)
	}
	for {
		id := uint16(rand.Uint32())
		if _, used := c.waiters[id]; !used {
			c.waiters[id] = w
			return c.conn, id, nil
		}
	}
}

// unregister forgets w, if still waiting; false if it was not (done is
// called, or was).
func (c *udpConn) unregister(id uint16, w *waiter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiters[id] == w {
		delete(c.waiters, id)
		return true
	}
	return false
}

// read delivers the socket's answers to their waiters until the socket
// fails or is closed, reading them in batches (recvmmsg).
func (c *udpConn) read(conn *net.UDPConn) {
	defer c.u.f.wg.Done()
	bc := newBatchConn(conn)
	msgs := readSlots(upstreamBatch, upstreamReadSize)
	var relay relayBatch
	for {
		n, err := bc.ReadBatch(msgs, 0)
		if err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) {
				// The server's port is closed (ICMP): whatever waits on
				// this socket will get no answer; let it try the next
				// server now rather than after the timeout.
				c.failAll(conn, fmt.Errorf("udp %s: %w", c.u.addr, err), false)
				continue
			}
			c.failAll(conn, fmt.Errorf("udp %s: %w", c.u.addr, err), true)
			return
		}
		for i := range msgs[:n] {
			m := &msgs[i]
			resp := m.Buffers[0][:m.N]
			if m.N < 12 {
				continue
			}
			if m.Flags&unix.MSG_TRUNC != 0 {
				// Bigger than our buffer: what we have is cut, so it
				// says truncated (TC), and the answer comes over TCP.
				resp[2] |= 0x02
			}
			id := binary.BigEndian.Uint16(resp)
			c.mu.Lock()
			w := c.waiters[id]
			if w == nil || !isAnswerTo(resp, id, w.q) {
				// Late or stray, or not the answer to that query:
				// keep waiting for it.
				c.mu.Unlock()
				continue
			}
			delete(c.waiters, id)
			c.mu.Unlock()
			w.done(resp, nil, &relay)
		}
		relay.flush() // before the next read reuses the buffers
	}
}

// sweep fails the queries past their deadline (those without a timer of
// their own) until the socket is closed or replaced.
func (c *udpConn) sweep(conn *net.UDPConn) {
	defer c.u.f.wg.Done()
	tick := time.NewTicker(min(max(c.u.f.timeout/8, 5*time.Millisecond), 250*time.Millisecond))
	defer tick.Stop()
	var expired []*waiter
	for {
		select {
		case <-c.u.f.ctx.Done():
			return
		case now := <-tick.C:
			c.mu.Lock()
			if c.conn != conn {
				c.mu.Unlock()
				return
			}
			for id, w := range c.waiters {
				if !w.deadline.IsZero() && now.After(w.deadline) {
					expired = append(expired, w)
					delete(c.waiters, id)
				}
			}
			c.mu.Unlock()
			for i, w := range expired {
				w.done(nil, fmt.Errorf("udp %s: %w", c.u.addr, context.DeadlineExceeded), nil)
				expired[i] = nil
			}
			expired = expired[:0]
		}
	}
}

// failAll fails every waiter of conn; drop also forgets the socket so that
// the next query dials a new one.
func (c *udpConn) failAll(conn *net.UDPConn, err error, drop bool) {
	c.mu.Lock()
	if c.conn != conn {
		c.mu.Unlock()
		return
	}
	failed := make([]*waiter, 0, len(c.waiters))
	for id, w := range c.waiters {
		failed = append(failed, w)
		delete(c.waiters, id)
	}
	if drop {
		conn.Close()
		c.conn = nil
	}
	c.mu.Unlock()
	for _, w := range failed {
		w.done(nil, err, nil)
	}
}

func (c *udpConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.conn != nil {
		c.conn.Close() // the reader fails its waiters and returns
	}
}

// sendBatch is forwarded queries registered on one socket and written to
// it together (sendmmsg): the UDP server's reader collects those of one
// read, so a burst of queries costs one system call upstream, not one each
// (#24: the forwarded path).
type sendBatch struct {
	c    *udpConn     // the socket of this batch; nil: pick one
	conn *net.UDPConn // c's socket when the first query was registered
	bc   batchConn
	msgs []ipv4.Message
	n    int
	ids  []uint16
	ws   []*waiter
	// bcs keeps the batchConn of the sockets used lately: a batch picks
	// a socket each time, and the wrapper costs allocations.
	bcs []struct {
		conn *net.UDPConn
		bc   batchConn
	}
}

// socket is the batch's socket to u, picked (round robin over u's) at the
// batch's first query.
func (b *sendBatch) socket(u *upstream) *udpConn {
	if b.c == nil || b.c.u != u {
		b.flush()
		b.c, b.conn = u.udp[u.next.Add(1)%udpConnsPerUpstream], nil
	}
	return b.c
}

// add registers w on the batch's socket and queues query (the caller's own
// copy: it gets w's ID). Unless it returns an error, w.done is called
// exactly once.
func (b *sendBatch) add(query []byte, w *waiter) error {
	conn, id, err := b.c.register(w)
	if err != nil {
		return err
	}
	if conn != b.conn {
		// The socket was (re)dialled: what is queued goes to the old one.
		c := b.c
		b.flush()
		b.c, b.conn, b.bc = c, conn, b.batchConn(conn)
	}
	binary.BigEndian.PutUint16(query, id)
	if b.n == len(b.msgs) {
		b.msgs = append(b.msgs, ipv4.Message{Buffers: [][]byte{nil}})
		b.ids = append(b.ids, 0)
		b.ws = append(b.ws, nil)
	}
	b.msgs[b.n].Buffers[0], b.ids[b.n], b.ws[b.n] = query, id, w
	b.n++
	return nil
}

func (b *sendBatch) batchConn(conn *net.UDPConn) batchConn {
	for _, x := range b.bcs {
		if x.conn == conn {
			return x.bc
		}
	}
	if len(b.bcs) >= 2*udpConnsPerUpstream {
		b.bcs = b.bcs[:0] // sockets were redialled: forget the old ones
	}
	bc := newBatchConn(conn)
	b.bcs = append(b.bcs, struct {
		conn *net.UDPConn
		bc   batchConn
	}{conn, bc})
	return bc
}

// flush writes the queued queries and ends the batch (the next picks a
// socket again); a query that cannot be written fails (its done gets the
// error, unless an answer or a failure came first).
func (b *sendBatch) flush() {
	for sent := 0; sent < b.n; {
		m, err := b.bc.WriteBatch(b.msgs[sent:b.n], 0)
		if err != nil {
			i := sent + max(m, 0)
			if b.c.unregister(b.ids[i], b.ws[i]) {
				b.ws[i].done(nil, fmt.Errorf("udp %s: %w", b.c.u.addr, err), nil)
			}
			m = max(m, 0) + 1
		}
		sent += m
	}
	for i := range b.msgs[:b.n] {
		b.msgs[i].Buffers[0], b.ws[i] = nil, nil
	}
	b.n, b.c, b.conn = 0, nil, nil
}

// relayBatch is answers an upstream socket's reader relays to clients,
// written after its read, per listening socket, in one system call each
// (sendmmsg). A packet added must stay valid until flush.
type relayBatch struct {
	to []relayTo
}

type relayTo struct {
	c    *net.UDPConn
	bc   batchConn
	msgs []ipv4.Message
	n    int
}

func (r *relayBatch) add(c *net.UDPConn, pkt []byte, addr net.Addr) {
	i := 0
	for i < len(r.to) && r.to[i].c != c {
		i++
	}
	if i == len(r.to) {
		r.to = append(r.to, relayTo{c: c, bc: newBatchConn(c)})
	}
	t := &r.to[i]
	if t.n == len(t.msgs) {
		t.msgs = append(t.msgs, ipv4.Message{Buffers: [][]byte{nil}})
	}
	t.msgs[t.n].Buffers[0], t.msgs[t.n].Addr = pkt, addr
	t.n++
}

// flush writes every answer added; one that cannot be written is lost, as
// a UDP answer may be (the client asks again).
func (r *relayBatch) flush() {
	for i := range r.to {
		t := &r.to[i]
		for sent := 0; sent < t.n; {
			m, err := t.bc.WriteBatch(t.msgs[sent:t.n], 0)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					break
				}
				m = max(m, 0) + 1
			}
			sent += m
		}
		for k := range t.msgs[:t.n] {
			t.msgs[k].Buffers[0], t.msgs[k].Addr = nil, nil
		}
		t.n = 0
	}
}
