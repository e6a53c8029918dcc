package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/meshagent/meshagent/messages"
)

// notReadyReason is Istio's readiness message until the first name table.
const notReadyReason = "DNS lookup table is not ready yet"

// Name is the service's name in logs, metrics, Health and /debug/tree.
const Name = "dns"

// Service is the DNS proxy: it serves DNS on loopback, answering mesh names
// from the latest NameTable and forwarding the rest.
type Service struct {
	cfg     Config
	table   messages.Latest[messages.NameTable]
	out     Outputs
	health  *messages.Reporter
	metrics *metrics
	log     *slog.Logger

	mu    sync.Mutex
	addrs []string // bound addresses of the current run
}

// Inputs are what the DNS proxy reads.
type Inputs struct {
	// Table: the mesh's names, from NDS (the XDS proxy) or a file (the
	// nametable service). Required.
	Table messages.Latest[messages.NameTable]
}

// Outputs are what the DNS proxy publishes.
type Outputs struct {
	// Answering is the table the proxy answers from, sent each time it
	// starts answering from a new one (/debug/ndsz renders it: NDSZ). May
	// be nil: nobody shows it.
	Answering messages.Sink[messages.DNSTable]
}

// New returns the DNS proxy service; an error for a bad Config (the only
// check of cfg) or metrics that cannot be registered.
func New(cfg Config, in Inputs, out Outputs, rt messages.Runtime) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if in.Table == nil {
		return nil, errors.New("dns: Inputs.Table is required")
	}
	m := newMetrics()
	if err := rt.Register(m.all...); err != nil {
		return nil, err
	}
	if out.Answering == nil {
		out.Answering = messages.Discard[messages.DNSTable]{}
	}
	return &Service{cfg: cfg.withDefaults(), table: in.Table, out: out, health: rt.Health, metrics: m, log: rt.Log}, nil
}

// String is the service's name in logs, metrics and /debug/tree.
func (s *Service) String() string { return Name }

// Addrs returns the addresses the proxy listens on (udp and tcp on each),
// once it reported Ready or Starting; nil when not running.
func (s *Service) Addrs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.addrs...)
}

// Serve listens, answers until ctx is done, then shuts both servers and the
// upstream sockets down and returns once every goroutine has.
func (s *Service) Serve(ctx context.Context) error {
	rc, err := loadResolvConf(s.cfg.ResolvConf)
	if err != nil {
		return err
	}
	search := rc.search
	if s.cfg.Search != nil {
		search = s.cfg.Search
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	fwd := newForwarder(rc.servers, s.cfg.ForwardTimeout, s.cfg.ForwardParallel, s.metrics, s.log)
	defer fwd.close() // again at the end of a run: closing twice is fine
	h := &handler{ctx: runCtx, fwd: fwd, metrics: s.metrics, log: s.log}

	// UDP: our batching server (udpserver.go); TCP: miekg's.
	udp := &udpServer{h: h}
	var servers []*dns.Server
	var bound []string
	for _, addr := range listenAddrs(s.cfg.Listen, rc.servers) {
		pcs, l, err := listen(addr, udpSockets())
		if err != nil {
			udp.shutdown()
			closeAll(servers)
			return err
		}
		bound = append(bound, pcs[0].LocalAddr().String())
		udp.conns = append(udp.conns, pcs...)
		servers = append(servers, &dns.Server{Listener: l, Handler: h})
	}
	var wg sync.WaitGroup
	failed := make(chan error, len(servers)+len(udp.conns))
	udp.serve(failed)
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.ActivateAndServe(); err != nil {
				failed <- err
			}
		}()
		// Wait for the start, so that Shutdown below never races it.
		select {
		case <-started:
		case err := <-failed:
			cancel()
			udp.shutdown()
			closeAll(servers)
			wg.Wait()
			return fmt.Errorf("dns server: %w", err)
		}
	}
	defer func() {
		cancel() // forwards in flight end first, so handlers return
		// The upstream sockets close before the UDP server waits: the
		// answers it still awaits fail at once (udpServer.forwardAsync).
		fwd.close()
		udp.shutdown()
		for _, srv := range servers {
			_ = srv.Shutdown()
		}
		wg.Wait()
		s.setAddrs(nil)
	}()
	s.setAddrs(bound)
	s.log.Info("DNS proxy listening", "addrs", bound, "upstreams", rc.servers, "search", search)

	ready := false
	for {
		nt, ok, changed := s.table.Watch()
		if ok {
			start := time.Now()
			t := buildTable(nt, s.cfg.Namespace, s.cfg.Domain, search)
			h.table.Store(t)
			s.out.Answering.Send(messages.DNSTable{Table: nt, Namespace: s.cfg.Namespace, Domain: s.cfg.Domain})
			s.log.Debug("name table loaded", "version", nt.Version, "hosts", t.hosts,
				"names", len(t.names)+len(t.wildcards), "took", time.Since(start))
			if !ready {
				ready = true
				s.sendHealth(messages.Ready, "")
			}
		} else if !ready {
			s.sendHealth(messages.Starting, notReadyReason)
		}
		select {
		case <-changed:
		case err := <-failed:
			return fmt.Errorf("dns server: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *Service) sendHealth(state messages.HealthState, reason string) {
	s.health.Report(state, reason)
}

func (s *Service) setAddrs(a []string) {
	s.mu.Lock()
	s.addrs = a
	s.mu.Unlock()
}

// listen binds addr over udp (n sockets) and tcp on the same port; with
// port 0, the tcp port follows the one the udp sockets got.
func listen(addr string, n int) ([]*net.UDPConn, net.Listener, error) {
	for attempt := 0; ; attempt++ {
		pcs, err := listenUDP(addr, n)
		if err != nil {
			return nil, nil, err
		}
		l, err := net.Listen("tcp", pcs[0].LocalAddr().String())
		if err == nil {
			return pcs, l, nil
		}
		for _, pc := range pcs {
			pc.Close()
		}
		_, port, _ := net.SplitHostPort(addr)
		if port != "0" || !errors.Is(err, syscall.EADDRINUSE) || attempt >= 10 {
			return nil, nil, fmt.Errorf("listen tcp %s: %w", addr, err)
		}
	}
}

func closeAll(servers []*dns.Server) {
	for _, srv := range servers {
		if srv.PacketConn != nil {
			srv.PacketConn.Close()
		}
		if srv.Listener != nil {
			srv.Listener.Close()
		}
	}
}
