package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3" // a typed config acted on

	"github.com/meshagent/meshagent/services/capture"
)

// The stand-in's one data path (#20), so that captured traffic flows in a
// pod: on every listener that takes captured connections — one bound to a
// port that uses the original destination (use_original_dst, or the
// original_dst listener filter), as Istio's virtualOutbound (15001) and
// virtualInbound (15006) — it accepts TCP and relays it byte for byte to the
// connection's original destination (SO_ORIGINAL_DST), as Envoy's
// ORIGINAL_DST passthrough clusters (PassthroughCluster,
// InboundPassthroughCluster) do. An inbound listener (traffic_direction
// INBOUND) connects from 127.0.0.6 (::6 for IPv6), as Istio's inbound
// clusters' upstream_bind_config, so that the capture rules
// (-o lo -s 127.0.0.6/32 -j RETURN) do not send the relayed connection back
// to 15006. A connection whose original destination is the listener's own
// port is closed, as Istio's BlackHoleCluster chain does.
//
// What it does NOT do, whatever the configuration says: no TLS (no mTLS, no
// SDS certificates used on the wire), no filter chains (no matching, no HTTP
// filters, no RBAC or authorization, no telemetry), no routing (a service's
// VIP is dialled as is: nothing sends it to the service's endpoints), no load
// balancing, no retries or timeouts, no draining of these connections, and
// REDIRECT capture only (TPROXY would need transparent listeners, whose
// original destination is their local address: not done).
//
// Stats, under Envoy's names: listener.<stat name>.downstream_cx_total and
// listener.<stat name>.downstream_cx_active; and one log line per relayed
// connection.

// inboundSource is where an inbound relay connects from, per family.
var inboundSource = map[bool]netip.Addr{false: netip.MustParseAddr("127.0.0.6"), true: netip.MustParseAddr("::6")}

// relaySpec is one address a capture listener binds.
type relaySpec struct {
	name, stat string // the listener's name and stat name
	addr       string // host:port to bind
	inbound    bool
}

// captureListeners are the relay addresses of ls: every bound address of
// every listener that uses the original destination.
func captureListeners(ls []*listenerv3.Listener) []relaySpec {
	var out []relaySpec
	for _, l := range ls {
		if !usesOriginalDst(l) || (l.GetBindToPort() != nil && !l.GetBindToPort().GetValue()) {
			continue
		}
		addrs := []*corev3.SocketAddress{l.GetAddress().GetSocketAddress()}
		for _, a := range l.GetAdditionalAddresses() {
			addrs = append(addrs, a.GetAddress().GetSocketAddress())
		}
		stat := listenerStatName(l, addrs[0])
		for _, sa := range addrs {
			if sa == nil {
				continue
			}
			out = append(out, relaySpec{
				name: l.GetName(), stat: stat, inbound: l.GetTrafficDirection() == corev3.TrafficDirection_INBOUND,
				addr: net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))),
			})
		}
	}
	return out
}

func usesOriginalDst(l *listenerv3.Listener) bool {
	if l.GetUseOriginalDst().GetValue() {
		return true
	}
	for _, f := range l.GetListenerFilters() {
		if f.GetName() == "envoy.filters.listener.original_dst" ||
			f.GetTypedConfig().GetTypeUrl() == "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst" {
			return true
		}
	}
	return false
}

// relays are the open capture listeners. Guarded by mu, which
// reconcileRelays holds while it opens and closes them (one caller at a
// time: start, then the ADS goroutine); e.mu is never held with it.
type relays struct {
	mu     sync.Mutex
	open   map[relaySpec]*relayListener
	closed bool
}

type relayListener struct {
	ln      net.Listener
	mu      sync.Mutex
	conns   map[net.Conn]bool
	closing bool // a connection tracked from now on is closed at once
	wg      sync.WaitGroup
}

// reconcileRelays opens the capture listeners the bootstrap and LDS name
// and closes those no longer named. An LDS update with a listener that
// cannot bind was rejected before it applied (bindCheck); one whose port
// was taken between that check and this bind is logged and tried again at
// the next update.
func (e *envoy) reconcileRelays() {
	e.mu.Lock()
	ls := append([]*listenerv3.Listener{}, e.boot.GetStaticResources().GetListeners()...)
	for _, m := range e.xds.resources[typeListener] {
		if l, ok := m.(*listenerv3.Listener); ok {
			ls = append(ls, l)
		}
	}
	e.mu.Unlock()
	want := map[relaySpec]bool{}
	for _, s := range captureListeners(ls) {
		want[s] = true
	}

	r := &e.relays
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	if r.open == nil {
		r.open = map[relaySpec]*relayListener{}
	}
	for s, rl := range r.open {
		if !want[s] {
			rl.close()
			delete(r.open, s)
			e.forget(s.addr)
			log.Printf("relay %s on %s: closed (no longer in the configuration)", s.name, s.addr)
		}
	}
	draining := e.drainingForChild()
	for s := range want {
		if r.open[s] != nil || draining {
			continue // a parent that drains for its child opens nothing new
		}
		ln, err := e.listen(s.name, s.network(), s.addr)
		if err != nil {
			log.Printf("relay %s: %v (not relaying on it)", s.name, err)
			continue
		}
		rl := &relayListener{ln: ln, conns: map[net.Conn]bool{}}
		r.open[s] = rl
		log.Printf("relay %s on %s: captured TCP goes to its original destination%s", s.name, s.addr,
			map[bool]string{true: ", from 127.0.0.6 / ::6", false: ""}[s.inbound])
		rl.wg.Add(1)
		go e.acceptRelay(s, rl)
	}
}

func (s relaySpec) host() string {
	h, _, _ := net.SplitHostPort(s.addr)
	return h
}

// drainingForChild reports whether this process drains for a hot
// restart's child, which opens nothing new.
func (e *envoy) drainingForChild() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hotDraining
}

func (s relaySpec) network() string {
	if ip, err := netip.ParseAddr(s.host()); err == nil && ip.Is6() {
		return "tcp6"
	}
	return "tcp4"
}

// bindCheck is Envoy's refusal of a listener it cannot bind: an LDS update
// with one whose port another socket holds (one without SO_REUSEPORT, as
// the stand-ins of parallel tests share Istio's 15001 and 15006 as Envoys
// do, bindSocket) is rejected, with Envoy's message (its LdsApiImpl: the
// listener's name, the error, a newline). The stand-in rejects the whole
// update, as it rejects any update it finds invalid, where Envoy applies
// the update's other listeners. Only capture listeners are bound on LDS
// here; an address already open is kept, as Envoy keeps an unchanged
// listener's socket.
func (e *envoy) bindCheck(l *listenerv3.Listener) error {
	if e.drainingForChild() {
		return nil // a parent that drains for its child opens nothing new
	}
	for _, s := range captureListeners([]*listenerv3.Listener{l}) {
		e.relays.mu.Lock()
		open := e.relays.open[s] != nil
		e.relays.mu.Unlock()
		if open {
			continue
		}
		sock, err := bindSocket(s.network(), s.addr)
		if err != nil {
			reason := err.Error()
			var errno syscall.Errno
			if errors.As(err, &errno) {
				reason = strerror(errno)
			}
			return fmt.Errorf("Error adding/updating listener(s) %s: cannot bind '%s': %s\n", l.GetName(), s.addr, reason)
		}
		sock.Close()
	}
	return nil
}

// strerror is errno as C's strerror words it, as Envoy's messages carry
// it ("Address already in use"; Go's is lower case).
func strerror(errno syscall.Errno) string {
	msg := errno.Error()
	return strings.ToUpper(msg[:1]) + msg[1:]
}

// closeRelays closes every capture listener and connection, for good.
func (e *envoy) closeRelays() {
	r := &e.relays
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for s, rl := range r.open {
		rl.close()
		delete(r.open, s)
	}
}

func (rl *relayListener) close() {
	rl.ln.Close()
	rl.mu.Lock()
	rl.closing = true
	for c := range rl.conns {
		c.Close()
	}
	rl.mu.Unlock()
	rl.wg.Wait()
}

func (rl *relayListener) track(c net.Conn, add bool) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	switch {
	case add && rl.closing:
		c.Close()
	case add:
		rl.conns[c] = true
	default:
		delete(rl.conns, c)
	}
}

func (e *envoy) acceptRelay(s relaySpec, rl *relayListener) {
	defer rl.wg.Done()
	for {
		c, err := rl.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				log.Printf("relay %s: accept: %v", s.name, err)
			}
			return
		}
		e.mu.Lock()
		e.bumpStatLocked("listener." + s.stat + ".downstream_cx_total")
		e.bumpStatLocked("listener." + s.stat + ".downstream_cx_active")
		e.mu.Unlock()
		rl.track(c, true)
		rl.wg.Add(1)
		go func() {
			defer rl.wg.Done()
			defer func() {
				rl.track(c, false)
				e.mu.Lock()
				active := "listener." + s.stat + ".downstream_cx_active"
				e.setStatLocked(active, e.statLocked(active)-1)
				e.mu.Unlock()
			}()
			if err := relay(s, c, rl); err != nil {
				log.Printf("relay %s: %s: %v", s.name, c.RemoteAddr(), err)
			}
		}()
	}
}

// relay copies c to its original destination and back until both sides
// have closed, half-closing each direction as it ends (tcp_proxy does too).
func relay(s relaySpec, c net.Conn, rl *relayListener) error {
	defer c.Close()
	dst, err := capture.OriginalDst(c)
	if err != nil {
		return fmt.Errorf("no original destination: %w", err)
	}
	if _, port, _ := net.SplitHostPort(s.addr); port == strconv.Itoa(int(dst.Port())) {
		return fmt.Errorf("original destination %s is the listener's own port: closed (BlackHoleCluster)", dst)
	}
	d := net.Dialer{}
	if s.inbound {
		d.LocalAddr = &net.TCPAddr{IP: inboundSource[dst.Addr().Is6()].AsSlice()}
	}
	up, err := d.Dial("tcp", dst.String())
	if err != nil {
		return fmt.Errorf("to original destination %s: %w", dst, err)
	}
	rl.track(up, true)
	defer rl.track(up, false)
	defer up.Close()
	var wg sync.WaitGroup
	var sent, received int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		sent, _ = io.Copy(up, c)
		up.(*net.TCPConn).CloseWrite()
	}()
	received, _ = io.Copy(c, up)
	c.(*net.TCPConn).CloseWrite()
	wg.Wait()
	log.Printf("relay %s: %s -> %s (original destination, from %s): %d bytes sent, %d received",
		s.name, c.RemoteAddr(), dst, up.LocalAddr(), sent, received)
	return nil
}
