// Package sds is the SDS server: it serves Envoy, over gRPC
// (envoy.service.secret.v3.SecretDiscoveryService) on a unix socket, the
// secrets Istio's agent serves: the workload certificate ("default") and the
// trusted roots ("ROOTCA", with the extra trust anchors and the CA's CRL),
// and the file secrets istiod names in DestinationRules ("file-cert:",
// "file-root:", "file-root:system"). Every change is pushed on the open
// streams that asked for it.
package sds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	sdsv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/grpcstop"
	"github.com/meshagent/meshagent/services/internal/uds"
)

// Name is the service's name in logs, metrics, Health and /debug/tree.
const Name = "sds"

// Inputs are the channels the SDS server reads.
type Inputs struct {
	// Certs: the workload certificate and the mesh roots, from certs.
	Certs messages.Latest[messages.CertBundle]
	// TrustAnchors: extra roots from the ProxyConfig (caCertificatesPem)
	// the XDS proxy receives with PROXY_CONFIG_XDS_AGENT, merged into
	// ROOTCA. Optional: nil when the agent has no such input.
	TrustAnchors messages.Latest[messages.TrustAnchors]
}

// Service is the SDS server.
type Service struct {
	cfg    Config
	in     Inputs
	health *messages.Reporter
	clock  messages.Clock
	log    *slog.Logger
	m      metrics

	streamIDs atomic.Int64 // stream numbers for logs and nonces; never reset
}

// Outputs: the SDS server publishes on no channel (it serves Envoy).
type Outputs struct{}

// New returns the SDS server reading in, or why cfg cannot work (the only
// check of cfg).
func New(cfg Config, in Inputs, _ Outputs, rt messages.Runtime) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if in.Certs == nil {
		return nil, errors.New("sds: Inputs.Certs is required")
	}
	s := &Service{cfg: cfg, in: in, health: rt.Health, clock: rt.Clock, log: rt.Log, m: newMetrics()}
	if err := rt.Register(s.m.all...); err != nil {
		return nil, err
	}
	return s, nil
}

// String is the service's name in logs, metrics and /debug/tree.
func (s *Service) String() string { return Name }

// Serve listens on the socket and serves until ctx is done; then it stops
// every stream, closes the listener and removes the socket file. It reports
// Ready once it listens (with the reason when an external SDS server serves
// the workload identity), and Degraded, naming them, while some asked-for
// secrets cannot be served.
func (s *Service) Serve(ctx context.Context) error {
	lis, external, err := s.openSocket()
	if err != nil {
		return err
	}
	st := newStore(s, external)
	storeCtx, cancelStore := context.WithCancel(context.Background())
	storeDone := make(chan error, 1)
	go func() { storeDone <- st.run(storeCtx) }()
	// The store outlives the gRPC server, so that ending streams can still
	// let go of their file secrets.
	stopStore := func() { cancelStore(); <-storeDone }

	if lis == nil { // an external SDS server, and no files socket
		select {
		case <-ctx.Done():
			stopStore()
			return ctx.Err()
		case err := <-storeDone:
			cancelStore()
			return fmt.Errorf("SDS secret store: %w", err)
		}
	}
	path := lis.Addr().String()
	defer uds.Remove(path)

	h := &handler{svc: s, store: st, stop: make(chan struct{})}
	srv := grpc.NewServer(grpc.MaxConcurrentStreams(100000))
	sdsv3.RegisterSecretDiscoveryServiceServer(srv, h)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	s.log.Info("SDS server listening", "socket", path)

	select {
	case <-ctx.Done():
	case err := <-served:
		h.shutdown(srv, s.clock.After(s.cfg.StopTimeout))
		stopStore()
		return fmt.Errorf("serve SDS on %s: %w", path, err)
	case err := <-storeDone:
		cancelStore()
		h.shutdown(srv, s.clock.After(s.cfg.StopTimeout))
		<-served
		return fmt.Errorf("SDS secret store: %w", err)
	}
	h.shutdown(srv, s.clock.After(s.cfg.StopTimeout))
	<-served
	stopStore()
	return ctx.Err()
}

// handler implements SecretDiscoveryService on top of the store's views.
type handler struct {
	sdsv3.UnimplementedSecretDiscoveryServiceServer
	svc   *Service
	store *store
	// stop is closed at shutdown: every stream returns, so that
	// GracefulStop does not wait for Envoy to hang up.
	stop     chan struct{}
	stopOnce sync.Once
	// readers counts the per-stream Recv goroutines, which outlive their
	// handler by a moment; shutdown waits for them.
	readers sync.WaitGroup
}

func (h *handler) shutdown(srv *grpc.Server, bound <-chan time.Time) {
	h.stopOnce.Do(func() { close(h.stop) })
	grpcstop.Within(srv, bound)
	h.readers.Wait()
}

type metrics struct {
	streams prometheus.Gauge
	pushes  *prometheus.CounterVec
	nacks   prometheus.Counter

	all []prometheus.Collector // every one above, to register
}

func newMetrics() metrics {
	var mm messages.Metrics
	m := metrics{
		streams: mm.Gauge("sds_streams", "Open SDS streams from Envoy."),
		pushes:  mm.CounterVec("sds_pushes_total", "Secrets sent to Envoy, by resource name.", "resource_name"),
		nacks:   mm.Counter("sds_nacks_total", "SDS responses rejected by Envoy."),
	}
	m.all = mm.Collectors()
	return m
}
