package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Envoy's listeners listen only once its workers start (#36): "all of the
// following [cluster and listener initialisation] happens before any
// listeners start listening and accepting new connections" (Envoy's
// architecture overview, Initialization). A listener's socket is created
// and bound on the main thread when the listener is added, so a bad
// address fails at once, but listen() is called just before the workers
// start (ListenSocketFactoryImpl::doFinalPreWorkerInit), which is when
// /ready turns LIVE. Until then a connection to Istio's 15021 or 15090, or
// to a capture port, is refused: the kubelet's first probes of a starting
// sidecar fail with "connection refused", never reaching the agent. A
// stand-in that answered on them from its first instant would be kinder
// than Envoy. The admin listener is not one of these: it listens at once.

// startWorkers closes e.workers when Envoy's workers would start: init
// complete (e.live), FAKE_ENVOY_NEVER_READY and FAKE_ENVOY_READY_AFTER
// honoured. /ready turns LIVE then (serverStateLocked).
//
// Each listener's socket starts listening first, as in Envoy's
// ListenerManagerImpl::startWorkers. One that cannot (its port taken by a
// socket that listened after the listener was bound) is removed, logged
// and counted as Envoy does it (finalInit), and then Envoy's workers never
// report started: it counted the listeners it waits for before it removed
// the failed one, so listener_manager.workers_started stays 0 and a hot
// restart's parent is never told to drain, while /ready says LIVE. Istio's
// readiness (and the agent's) waits for workers_started, so such a sidecar
// never turns ready. A stand-in that only logged the failure would be kinder
// than Envoy.
func (e *envoy) startWorkers(ctx context.Context) {
	select {
	case <-e.live:
	case <-ctx.Done():
		return
	}
	if e.k.neverReady {
		return
	}
	if d := e.k.readyAfter - time.Since(e.started); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return
		}
	}
	e.mu.Lock()
	e.workersStarting = true // a listener added from now on listens at once (envoy.listen)
	bound := make([]*workerListener, 0, len(e.bound))
	for _, ln := range e.bound {
		bound = append(bound, ln.(*workerListener))
	}
	e.mu.Unlock()
	failed := 0
	for _, wl := range bound {
		if !e.finalInit(wl) {
			failed++
		}
	}
	if failed == 0 {
		e.mu.Lock()
		e.setStatLocked("listener_manager.workers_started", 1)
		e.mu.Unlock()
	}
	close(e.workers)
}

// finalInit makes a listener's socket listen, or removes the listener as
// Envoy does when it cannot (doFinalPreWorkerListenerInit): its error
// logged, listener_manager.listener_create_failure counted, false. A
// listener closed meanwhile (no longer configured, or drained for a child)
// is no failure.
func (e *envoy) finalInit(wl *workerListener) bool {
	_, err := wl.listen()
	if err == nil || errors.Is(err, net.ErrClosed) {
		return true
	}
	why := err.Error()
	if errno := syscall.Errno(0); errors.As(err, &errno) {
		why = fmt.Sprintf("cannot listen() errno=%d", int(errno))
	}
	log.Printf("final pre-worker listener init for listener '%s' failed: %s", wl.name, why)
	e.mu.Lock()
	e.bumpStatLocked("listener_manager.listener_create_failure")
	if e.bound[wl.key] == net.Listener(wl) {
		delete(e.bound, wl.key)
	}
	e.removed[wl.name] = true
	e.mu.Unlock()
	wl.Close()
	return false
}

// workerListener is a listener's socket as Envoy holds it: bound, and
// listening and accepting once the workers start. Its socket is either
// bound here (bindSocket) or the parent's, passed in a hot restart, which
// the parent's workers already listen and accept on: the child takes its
// share of the same socket when its own workers start.
type workerListener struct {
	name    string   // Envoy's name of the listener, for its log lines
	key     string   // its key in envoy.bound (listenKey)
	sock    *os.File // the socket; passed to a child as it is
	addr    net.Addr
	workers <-chan struct{}

	mu     sync.Mutex
	ln     net.Listener // once listening
	err    error
	closed chan struct{}
}

func newWorkerListener(name, key string, sock *os.File, workers <-chan struct{}) (*workerListener, error) {
	var sa unix.Sockaddr
	err := control(sock, func(fd int) (err error) { sa, err = unix.Getsockname(fd); return err })
	if err != nil {
		sock.Close()
		return nil, err
	}
	return &workerListener{name: name, key: key, sock: sock, addr: tcpAddr(sa), workers: workers, closed: make(chan struct{})}, nil
}

// Accept waits for the workers, then accepts.
func (l *workerListener) Accept() (net.Conn, error) {
	select {
	case <-l.workers:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	ln, err := l.listen()
	if err != nil {
		return nil, err
	}
	return ln.Accept()
}

// listen makes the socket listen, once: listen() on a socket that already
// listens (the parent's) only sets its backlog again.
func (l *workerListener) listen() (net.Listener, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.closed:
		return nil, net.ErrClosed
	default:
	}
	if l.ln == nil && l.err == nil {
		if err := control(l.sock, func(fd int) error { return unix.Listen(fd, unix.SOMAXCONN) }); err != nil {
			l.err = fmt.Errorf("listen on %s: %w", l.addr, err)
		} else {
			l.ln, l.err = net.FileListener(l.sock)
		}
	}
	return l.ln, l.err
}

func (l *workerListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.closed:
		return net.ErrClosed
	default:
	}
	close(l.closed)
	if l.ln != nil {
		l.ln.Close()
	}
	return l.sock.Close()
}

func (l *workerListener) Addr() net.Addr { return l.addr }

// SyscallConn is the socket's, for a child that asks for it
// (passListenSocket).
func (l *workerListener) SyscallConn() (syscall.RawConn, error) { return l.sock.SyscallConn() }

// bindSocket is a TCP socket bound to addr and not listening, with the
// options Go's net.Listen sets (SO_REUSEADDR; a wildcard IPv6 address on
// "tcp" is dual-stack, on "tcp6" IPv6 only) and SO_REUSEPORT, as Envoy
// binds a listener on Linux (Listener.enable_reuse_port defaults to true;
// Istio leaves it). So two Envoys of one user on one host both listen on a
// port, the kernel spreading connections between them, while a socket
// without SO_REUSEPORT that listens first still makes Envoy's listen() fail
// (TestListenersListenOnceTheWorkersStart). Without it, two stand-ins of
// parallel tests that bound Istio's 15001 before either listened left the
// second one's workers unstarted, and its agent never ready (make test,
// TestProxyConfigTablesMatchTheConfigDump).
func bindSocket(network, addr string) (*os.File, error) {
	ta, err := net.ResolveTCPAddr(network, addr)
	if err != nil {
		return nil, err
	}
	family, sa := unix.AF_INET, unix.Sockaddr(nil)
	if ip4 := ta.IP.To4(); network != "tcp6" && (ta.IP == nil || ip4 != nil) {
		a := &unix.SockaddrInet4{Port: ta.Port}
		copy(a.Addr[:], ip4)
		sa = a
	} else {
		family = unix.AF_INET6
		a := &unix.SockaddrInet6{Port: ta.Port}
		copy(a.Addr[:], ta.IP.To16())
		sa = a
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	for _, opt := range []int{unix.SO_REUSEADDR, unix.SO_REUSEPORT} {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, opt, 1); err != nil {
			unix.Close(fd)
			return nil, os.NewSyscallError("setsockopt", err)
		}
	}
	if family == unix.AF_INET6 {
		v6only := 0
		if network == "tcp6" {
			v6only = 1
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, v6only); err != nil {
			unix.Close(fd)
			return nil, os.NewSyscallError("setsockopt", err)
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, &net.OpError{Op: "listen", Net: network, Addr: ta, Err: os.NewSyscallError("bind", err)}
	}
	return os.NewFile(uintptr(fd), addr), nil
}

// control runs f on the socket's descriptor. Not os.File.Fd, which would
// make the socket blocking, for every descriptor of it (O_NONBLOCK is the
// open file's), the listener's among them.
func control(sock syscall.Conn, f func(fd int) error) error {
	rc, err := sock.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

func tcpAddr(sa unix.Sockaddr) net.Addr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]).To16(), Port: a.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	}
	return &net.TCPAddr{}
}
