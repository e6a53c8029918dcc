// Package sds is the SDS server: it serves the workload certificate
// ("default") and the trusted roots ("ROOTCA") to Envoy over gRPC
// (envoy.service.secret.v3.SecretDiscoveryService) on a unix socket, and
// pushes a new certificate on every open stream as soon as it arrives.
package sds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	sdsv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/messages"
)

// ErrSocketInUse: another server answers on the socket path.
var ErrSocketInUse = errors.New("a live server is already listening on the SDS socket")

// Name is the service's name in logs, metrics, Health and /debug/tree.
const Name = "sds"

// Service is the SDS server.
type Service struct {
	cfg    Config
	certs  messages.Latest[messages.CertBundle]
	health *messages.Reporter
	log    *slog.Logger
	m      metrics

	streamIDs atomic.Int64 // stream numbers for logs and nonces; never reset
}

// New returns the SDS server. It serves what certs holds.
func New(cfg Config, certs messages.Latest[messages.CertBundle], rt messages.Runtime) (*Service, error) {
	s := &Service{cfg: cfg, certs: certs, health: rt.Health, log: rt.Log, m: newMetrics()}
	if err := rt.Register(s.m.streams, s.m.pushes, s.m.nacks); err != nil {
		return nil, err
	}
	return s, nil
}

// String is the service's name in logs, metrics and /debug/tree.
func (s *Service) String() string { return Name }

// Serve listens on the socket and serves until ctx is done; then it stops
// every stream, closes the listener and removes the socket file.
func (s *Service) Serve(ctx context.Context) error {
	if err := s.cfg.Validate(); err != nil {
		return err
	}
	lis, err := s.listen()
	if err != nil {
		return err
	}
	defer removeSocket(s.cfg.SocketPath)

	h := &handler{svc: s, stop: make(chan struct{})}
	srv := grpc.NewServer(grpc.MaxConcurrentStreams(100000))
	sdsv3.RegisterSecretDiscoveryServiceServer(srv, h)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	s.log.Info("SDS server listening", "socket", s.cfg.SocketPath)
	s.health.Report(messages.Ready, "")

	select {
	case <-ctx.Done():
	case err := <-served:
		h.shutdown(srv, s.cfg.StopTimeout)
		return fmt.Errorf("serve SDS on %s: %w", s.cfg.SocketPath, err)
	}
	h.shutdown(srv, s.cfg.StopTimeout)
	<-served
	return ctx.Err()
}

// listen prepares the directory, clears a stale socket, refuses to take over
// a live one, and listens with owner-only permissions.
func (s *Service) listen() (net.Listener, error) {
	path := s.cfg.SocketPath
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create SDS socket directory %s: %w", dir, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("SDS socket path %s exists and is not a socket (%s)", path, fi.Mode())
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: %w", path, ErrSocketInUse)
		}
		s.log.Info("removing stale SDS socket", "socket", path)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove stale SDS socket %s: %w", path, err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on SDS socket %s: %w", path, err)
	}
	// The directory is 0750, so nobody else can reach the socket in the
	// moment before the chmod.
	mode := os.FileMode(0o600)
	if s.cfg.SocketGID >= 0 {
		mode = 0o660
	}
	if err := os.Chmod(path, mode); err != nil {
		lis.Close()
		return nil, fmt.Errorf("chmod SDS socket %s: %w", path, err)
	}
	if s.cfg.SocketUID >= 0 || s.cfg.SocketGID >= 0 {
		if err := os.Chown(path, s.cfg.SocketUID, s.cfg.SocketGID); err != nil {
			lis.Close()
			return nil, fmt.Errorf("chown SDS socket %s to %d:%d: %w", path, s.cfg.SocketUID, s.cfg.SocketGID, err)
		}
	}
	return lis, nil
}

// removeSocket is best effort: the listener usually unlinks the socket
// itself, and a leftover one is removed as stale on the next start.
func removeSocket(path string) { _ = os.Remove(path) }

// handler implements SecretDiscoveryService on top of the latest CertBundle.
type handler struct {
	sdsv3.UnimplementedSecretDiscoveryServiceServer
	svc *Service
	// stop is closed at shutdown: every stream returns, so that
	// GracefulStop does not wait for Envoy to hang up.
	stop     chan struct{}
	stopOnce sync.Once
	// readers counts the per-stream Recv goroutines, which outlive their
	// handler by a moment; shutdown waits for them.
	readers sync.WaitGroup
}

func (h *handler) shutdown(srv *grpc.Server, bound time.Duration) {
	h.stopOnce.Do(func() { close(h.stop) })
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		srv.Stop()
		<-done
	}
	h.readers.Wait()
}

type metrics struct {
	streams prometheus.Gauge
	pushes  *prometheus.CounterVec
	nacks   prometheus.Counter
}

func newMetrics() metrics {
	return metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sds_streams", Help: "Open SDS streams from Envoy.",
		}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sds_pushes_total", Help: "Secrets sent to Envoy, by resource name.",
		}, []string{"resource_name"}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sds_nacks_total", Help: "SDS responses rejected by Envoy.",
		}),
	}
}
