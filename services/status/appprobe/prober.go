package appprobe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// The status server answers kubelet's rewritten probes by probing the
// application itself, as Istio's agent does (pilot-agent status server,
// handleAppProbe): kubelet cannot reach an application behind mTLS, the
// agent can, from inside the pod.

// probeResult is what one probe of the application found.
type probeResult struct {
	// code is the status to answer kubelet with: the application's own
	// for HTTP, else 200 or 500.
	code int
	// body is the start of the application's answer to an HTTP probe.
	body []byte
	// err says why the probe failed when the application could not be
	// asked or gave no usable answer (a refused connection, a timeout, a
	// gRPC status other than SERVING); nil when it answered HTTP, whatever
	// the status.
	err error
}

// reason says why a probe failed, for logs and WorkloadHealth.
func (r probeResult) reason() string {
	if r.err != nil {
		return r.err.Error()
	}
	return "status " + strconv.Itoa(r.code) + " " + http.StatusText(r.code)
}

// healthy is kubelet's verdict: a status from 200 to 399.
func (r probeResult) healthy() bool {
	return r.err == nil && r.code >= http.StatusOK && r.code < http.StatusBadRequest
}

func failed(err error) probeResult {
	return probeResult{code: http.StatusInternalServerError, err: err}
}

// Prober probes the application for the status server: kubelet's
// rewritten probes (ServeHTTP) and the VM's readiness probe (Check). It is
// safe for concurrent use.
type Prober struct {
	cfg    Config
	log    *slog.Logger
	dialer *probeDialer
	client *http.Client
}

// New returns the prober of cfg.
func New(cfg Config, log *slog.Logger) *Prober {
	d := &probeDialer{log: log}
	return &Prober{cfg: cfg, log: log, dialer: d, client: newProbeHTTPClient(cfg, d)}
}

// ServeHTTP answers /app-health/<container>/<livez|readyz|startupz>
// and /app-lifecycle/<container>/<prestopz|poststartz>. net/http serves each
// request on its own goroutine and a probe holds no lock, so a slow
// application delays only its own probe.
func (p *Prober) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	probe, ok := p.cfg.App[r.URL.Path]
	if !ok {
		// Istio answers 400 to a path it was not given.
		http.Error(w, fmt.Sprintf("no application probe is configured for %s", r.URL.Path), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), probe.timeout())
	defer cancel()
	var res probeResult
	switch {
	case probe.HTTPGet != nil:
		res = p.http(ctx, p.appHTTPRequest(r, probe.HTTPGet))
	case probe.TCPSocket != nil:
		res = p.tcp(ctx, net.JoinHostPort(p.host(), strconv.Itoa(int(probe.TCPSocket.Port))))
	case probe.GRPC != nil:
		res = p.grpc(ctx, net.JoinHostPort(p.host(), strconv.Itoa(int(probe.GRPC.Port))),
			derefOr(probe.GRPC.Service, ""), r.Header.Get("User-Agent"))
	}
	if res.err != nil {
		p.log.Info("application probe failed", "path", r.URL.Path, "error", res.err)
	}
	w.WriteHeader(res.code)
	_, _ = w.Write(res.body)
}

// host is where probes go: INSTANCE_IP, as kubelet would, or
// localhost (REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION, or no IP known).
func (p *Prober) host() string {
	if p.cfg.Host == "" {
		return "localhost"
	}
	return p.cfg.Host
}

func derefOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// CloseIdleConnections ends the connections kept to the application, once
// the server serving p has stopped.
func (p *Prober) CloseIdleConnections() { p.client.CloseIdleConnections() }

// tcp is kubelet's tcpSocket probe: a connection is success.
func (p *Prober) tcp(ctx context.Context, addr string) probeResult {
	conn, err := p.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return failed(fmt.Errorf("tcp %s: %w", addr, err))
	}
	conn.Close()
	return probeResult{code: http.StatusOK}
}

// probeDialer dials from 127.0.0.6 (::6 for an IPv6 target): Istio's
// capture rules return traffic from that address to the application
// untouched instead of redirecting it to Envoy's inbound listener, so a
// probe does not need mTLS. Where the address cannot be bound (::6 is
// usually not on lo outside a pod) it dials from the default address and
// says so once.
type probeDialer struct {
	log *slog.Logger
	// unbindable[v6] is set once the source address failed to bind.
	unbindable [2]atomic.Bool
	warned     [2]sync.Once
}

// probeSource is the source address of probes to a target of each family.
func probeSource(v6 bool) *net.TCPAddr {
	if v6 {
		return &net.TCPAddr{IP: net.ParseIP("::6")}
	}
	return &net.TCPAddr{IP: net.ParseIP("127.0.0.6")}
}

// DialContext dials addr from the probe source address.
func (d *probeDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	v6 := isIPv6HostPort(addr)
	fam := 0
	if v6 {
		fam = 1
	}
	if !d.unbindable[fam].Load() {
		conn, err := lingeringDialer(probeSource(v6)).DialContext(ctx, network, addr)
		var sysErr *os.SyscallError
		if err == nil || !errors.As(err, &sysErr) || sysErr.Syscall != "bind" {
			return conn, err
		}
		d.unbindable[fam].Store(true)
		d.warned[fam].Do(func() {
			d.log.Warn("cannot send application probes from the capture-exempt source address; "+
				"sending them from the default address, which inbound capture may redirect to Envoy",
				"source", probeSource(v6).IP.String(), "error", err)
		})
	}
	return lingeringDialer(nil).DialContext(ctx, network, addr)
}

func isIPv6HostPort(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.To4() == nil
}

// lingeringDialer sets SO_LINGER to 1 second, as kubelet's and Istio's
// probe dialers do (kubernetes#89898): a probe every few seconds would
// otherwise leave sockets in TIME-WAIT for a minute each.
func lingeringDialer(source *net.TCPAddr) *net.Dialer {
	d := &net.Dialer{
		Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) {
				_ = unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 1})
			})
		},
	}
	if source != nil {
		d.LocalAddr = source
	}
	return d
}
