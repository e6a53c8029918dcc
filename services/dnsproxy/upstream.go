package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

const (
	// udpConnsPerUpstream is how many connected UDP sockets each upstream
	// gets: queries are spread over them and matched to answers by ID, so
	// no query dials a socket of its own.
	udpConnsPerUpstream = 4
	// idleTCPPerUpstream is how many idle TCP connections are kept.
	idleTCPPerUpstream = 4
	// tcpIdleMax is how long an idle TCP connection is kept for reuse:
	// servers close idle connections, and some (dnsmasq) spend a process
	// on each.
	tcpIdleMax = 5 * time.Second
	// maxInFlightPerConn bounds the IDs in use on one socket (of 65536).
	maxInFlightPerConn = 16384
	// upstreamBatch is how many answers one read takes (recvmmsg), and
	// upstreamReadSize the buffer of each: a bigger UDP answer is taken as
	// truncated and fetched over TCP.
	upstreamBatch    = 8
	upstreamReadSize = dns.DefaultMsgSize
)

var (
	errClosed      = errors.New("forwarder closed")
	errTooMany     = errors.New("too many queries in flight")
	errBadResponse = errors.New("response does not match the query")
)

// forwarder sends queries the table does not answer to the nameservers of
// resolv.conf. Istio dials a new socket per query and never retries a
// truncated answer over TCP; this one reuses sockets and does.
type forwarder struct {
	servers  []*upstream
	timeout  time.Duration
	parallel bool
	metrics  *metrics
	log      *slog.Logger

	ctx    context.Context // cancelled by close
	cancel context.CancelFunc
	wg     sync.WaitGroup // socket readers and parallel exchanges
}

func newForwarder(servers []string, timeout time.Duration, parallel bool, m *metrics, log *slog.Logger) *forwarder {
	f := &forwarder{timeout: timeout, parallel: parallel, metrics: m, log: log}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	for _, addr := range servers {
		u := &upstream{f: f, addr: addr, idleTCP: make(chan idleConn, idleTCPPerUpstream)}
		for i := range u.udp {
			u.udp[i] = &udpConn{u: u}
		}
		f.servers = append(f.servers, u)
	}
	return f
}

// close stops every exchange and socket and waits for their goroutines.
func (f *forwarder) close() {
	f.cancel()
	for _, u := range f.servers {
		for _, c := range u.udp {
			c.close()
		}
		for {
			select {
			case c := <-u.idleTCP:
				c.conn.Close()
				continue
			default:
			}
			break
		}
	}
	f.wg.Wait()
}

// forward returns upstream's response to req as it came on the wire, with
// req's ID, or nil when no nameserver answered. tcp is the client's
// protocol, used upstream too. The answer is relayed, not re-encoded: it is
// checked (ID, QR, the same question) but never unpacked here.
func (f *forwarder) forward(ctx context.Context, req *dns.Msg, tcp bool) []byte {
	f.metrics.upstreamRequests.Inc()
	start := time.Now()
	defer func() { f.metrics.upstreamDuration.Observe(time.Since(start).Seconds()) }()
	query, err := req.Pack()
	if err != nil {
		f.log.Debug("cannot forward query", "error", err)
		f.metrics.upstreamFailures.Inc()
		return nil
	}
	q, ok := questionOf(query)
	if !ok {
		f.metrics.upstreamFailures.Inc()
		return nil
	}
	resp := f.exchange(ctx, query, q, tcp, 0)
	if resp == nil {
		f.metrics.upstreamFailures.Inc()
		return nil
	}
	binary.BigEndian.PutUint16(resp, req.Id)
	return resp
}

// exchange asks the nameservers from the from-th on (all at once when
// parallel) for the answer to the packed query; nil if none answered.
func (f *forwarder) exchange(ctx context.Context, query, q []byte, tcp bool, from int) []byte {
	if f.parallel && len(f.servers) > 1 {
		return f.forwardParallel(ctx, query, q, tcp)
	}
	for _, u := range f.servers[from:] {
		resp, err := u.exchange(ctx, query, q, tcp)
		if err == nil {
			return resp
		}
		f.log.Debug("upstream failed", "upstream", u.addr, "error", err)
	}
	return nil
}

// forwardParallel asks every nameserver at once; the first answer wins.
func (f *forwarder) forwardParallel(ctx context.Context, query, q []byte, tcp bool) []byte {
	results := make(chan []byte, len(f.servers)) // never blocks a loser
	for _, u := range f.servers {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			resp, err := u.exchange(ctx, query, q, tcp)
			if err != nil {
				f.log.Debug("upstream failed", "upstream", u.addr, "error", err)
			}
			results <- resp
		}()
	}
	for range f.servers {
		if resp := <-results; resp != nil {
			return resp
		}
	}
	return nil
}

// upstream is one nameserver and its sockets.
type upstream struct {
	f       *forwarder
	addr    string
	udp     [udpConnsPerUpstream]*udpConn
	next    atomic.Uint32 // round robin over udp
	idleTCP chan idleConn
}

type idleConn struct {
	conn  net.Conn
	since time.Time
}

// exchange sends the packed query over UDP (TCP fallback on truncation) or
// over TCP, and returns the matching response.
func (u *upstream) exchange(ctx context.Context, query, q []byte, tcp bool) ([]byte, error) {
	if tcp {
		return u.exchangeTCP(ctx, query, q)
	}
	c := u.udp[u.next.Add(1)%udpConnsPerUpstream]
	resp, err := c.exchange(ctx, query, q)
	if err != nil {
		return nil, err
	}
	if resp[2]&0x02 != 0 { // TC
		// Better than Istio: get the whole answer over TCP, and let the
		// client's size decide whether it must come back over TCP.
		if full, err := u.exchangeTCP(ctx, query, q); err == nil {
			return full, nil
		}
	}
	return resp, nil
}

// exchangeTCP sends the query over an idle (or new) TCP connection; a reused
// connection the server has closed in the meantime is retried once on a new
// one.
func (u *upstream) exchangeTCP(ctx context.Context, query, q []byte) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		conn, reused, err := u.tcpConn(ctx)
		if err != nil {
			return nil, err
		}
		resp, err := u.tcpRoundTrip(ctx, conn, query, q)
		if err == nil {
			if u.f.ctx.Err() != nil {
				conn.Close() // closing: the pool has been drained already
				return resp, nil
			}
			select {
			case u.idleTCP <- idleConn{conn, time.Now()}:
			default:
				conn.Close()
			}
			return resp, nil
		}
		conn.Close()
		if !reused || attempt > 0 || ctx.Err() != nil {
			return nil, err
		}
	}
}

func (u *upstream) tcpConn(ctx context.Context) (net.Conn, bool, error) {
	for {
		select {
		case c := <-u.idleTCP:
			if time.Since(c.since) < tcpIdleMax {
				return c.conn, true, nil
			}
			c.conn.Close()
			continue
		default:
		}
		break
	}
	if u.f.ctx.Err() != nil {
		return nil, false, errClosed
	}
	d := net.Dialer{Timeout: u.f.timeout}
	c, err := d.DialContext(ctx, "tcp", u.addr)
	if err != nil {
		return nil, false, fmt.Errorf("dial tcp %s: %w", u.addr, err)
	}
	return c, false, nil
}

func (u *upstream) tcpRoundTrip(ctx context.Context, conn net.Conn, query, q []byte) ([]byte, error) {
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	stopF := context.AfterFunc(u.f.ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stopF()
	if err := conn.SetDeadline(time.Now().Add(u.f.timeout)); err != nil {
		return nil, err
	}
	id := uint16(rand.Uint32())
	buf := make([]byte, 2+len(query))
	binary.BigEndian.PutUint16(buf, uint16(len(query)))
	copy(buf[2:], query)
	binary.BigEndian.PutUint16(buf[2:], id)
	if _, err := conn.Write(buf); err != nil {
		return nil, fmt.Errorf("tcp %s: %w", u.addr, err)
	}
	var l [2]byte
	if _, err := io.ReadFull(conn, l[:]); err != nil {
		return nil, fmt.Errorf("tcp %s: %w", u.addr, err)
	}
	body := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(conn, body); err != nil {
		return nil, fmt.Errorf("tcp %s: %w", u.addr, err)
	}
	if !isAnswerTo(body, id, q) {
		return nil, fmt.Errorf("tcp %s: %w", u.addr, errBadResponse)
	}
	return body, nil
}

// questionOf returns the question section of a packed query with one
// question (the name is never compressed: nothing comes before it).
func questionOf(msg []byte) ([]byte, bool) {
	if len(msg) < 12 || binary.BigEndian.Uint16(msg[4:]) != 1 {
		return nil, false
	}
	off := 12
	for {
		if off >= len(msg) {
			return nil, false
		}
		l := int(msg[off])
		if l == 0 {
			off++
			break
		}
		if l&0xc0 != 0 {
			return nil, false
		}
		off += 1 + l
	}
	if off+4 > len(msg) {
		return nil, false
	}
	return msg[12 : off+4], true
}

// isAnswerTo reports whether resp is a response with the given ID to the
// question q (names compared without case: resolvers may randomise it).
func isAnswerTo(resp []byte, id uint16, q []byte) bool {
	if len(resp) < 12+len(q) || binary.BigEndian.Uint16(resp) != id || resp[2]&0x80 == 0 ||
		binary.BigEndian.Uint16(resp[4:]) != 1 {
		return false
	}
	for i, b := range resp[12 : 12+len(q)] {
		if lower(b) != lower(q[i]) {
			return false
		}
	}
	return true
}

func lower(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + ('a' - 'A')
	}
	return b
}
