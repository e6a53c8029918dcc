// Package controlplane is the embedded control plane of `meshagent
// standalone`: an xDS server built on go-control-plane that serves, to any
// node, the listeners, clusters, routes and endpoints istiod would send a
// sidecar for the mesh described in a YAML file, and Istio's NDS name table
// for the agent's DNS proxy. It reloads the file when it changes.
package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	gcplog "github.com/envoyproxy/go-control-plane/pkg/log"
	xds "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/services/internal/filewatch"
	"github.com/meshagent/meshagent/services/internal/loopback"
)

// Name is the service's name in logs, metrics, Health and /debug/tree.
const Name = "controlplane"

// Service is the embedded control plane.
type Service struct {
	cfg    Config
	health *messages.Reporter
	clock  messages.Clock
	log    *slog.Logger
	m      metrics

	// generation numbers the snapshots across restarts of Serve, so that a
	// version is never reused while the process lives. Only Serve touches
	// it, and Serve never overlaps itself.
	generation uint64
	server     loopback.Server
}

// Inputs: the control plane reads no channel.
type Inputs struct{}

// Outputs: the control plane publishes on no channel (it serves xDS).
type Outputs struct{}

// New returns the control plane, or why cfg cannot work (the only check of
// cfg). Nothing is read or opened until Serve.
func New(cfg Config, _ Inputs, _ Outputs, rt messages.Runtime) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, health: rt.Health, clock: rt.Clock, log: rt.Log, m: newMetrics()}
	if err := rt.Register(s.m.all...); err != nil {
		return nil, err
	}
	return s, nil
}

// String is the service's name.
func (s *Service) String() string { return Name }

// Addr is the address the server listens on, "" when it is not listening:
// for a caller that asked for port 0.
func (s *Service) Addr() string { return s.server.Addr() }

// Serve loads the mesh file, serves xDS until ctx is done, and reloads the
// file whenever it changes. A file that does not load keeps the last good
// snapshot (Degraded), or none before the first (Starting): either way the
// server keeps watching for a fixed file rather than failing.
func (s *Service) Serve(ctx context.Context) error {
	creds, err := s.transportCredentials()
	if err != nil {
		return err
	}
	// A change of the mesh file, by its name or by a Kubernetes ..data
	// swap, is read again (an unchanged file is then a no-op); other files
	// of its directory are not: a bad file's warning written to a log in
	// the same directory would wake the watcher for ever (#32). A
	// directory not there yet is waited for, serving nothing meanwhile
	// (Starting).
	watcher, err := filewatch.Start(filewatch.Options{Clock: s.clock, Log: s.log, Debounce: s.cfg.Debounce, Files: []string{s.cfg.MeshFile}},
		filewatch.DirsOf(s.cfg.MeshFile)...)
	if err != nil {
		return fmt.Errorf("controlplane: mesh file %s: %w", s.cfg.MeshFile, err)
	}
	defer watcher.Close()

	snapshots := cache.NewSnapshotCache(false, nodeGroupHash{}, s.cacheLogger())
	names := cache.NewLinearCache(NameTableType, cache.WithLogger(s.cacheLogger()), cache.WithVersionPrefix("nds-"))
	mux := &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return classify(r.GetTypeUrl()) },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return classify(r.GetTypeUrl()) },
		Caches:        map[string]cache.Cache{"snapshot": snapshots, "nds": names},
	}
	st := &state{svc: s, snapshots: snapshots, names: names}
	st.reload(ctx)

	// The xDS server's streams end when serveCtx does: that is what lets
	// GracefulStop finish without waiting for clients to hang up.
	serveCtx, stopStreams := context.WithCancel(ctx)
	defer stopStreams()
	xdsServer := xds.NewServer(serveCtx, mux, s.callbacks())
	opts := []grpc.ServerOption{
		grpc.MaxConcurrentStreams(100000),
		grpc.StreamInterceptor(s.checkToken),
		// istiod accepts keepalive pings every Time/2 (15 s with Istio's
		// 30 s default, pilot/pkg/grpc); grpc-go's default of 5 minutes
		// answers the agents' 30 s pings with GOAWAY "too_many_pings"
		// after three, resetting every stream after about 2 minutes.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 15 * time.Second}),
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(srv, xdsServer)
	clusterservice.RegisterClusterDiscoveryServiceServer(srv, xdsServer)
	endpointservice.RegisterEndpointDiscoveryServiceServer(srv, xdsServer)
	listenerservice.RegisterListenerDiscoveryServiceServer(srv, xdsServer)
	routeservice.RegisterRouteDiscoveryServiceServer(srv, xdsServer)
	if err := s.server.Start(srv, s.cfg.Listen); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	s.log.Info("control plane listening", "address", s.server.Addr(), "mesh_file", s.cfg.MeshFile, "tls", creds != nil)
	st.report()

	// Responses in flight finish, up to StopTimeout.
	stop := func() {
		stopStreams()
		if s.server.Stop(s.clock.After(s.cfg.StopTimeout)) {
			s.log.Warn("xDS streams did not end in time; closed them", "timeout", s.cfg.StopTimeout)
		}
	}
	for {
		select {
		case err := <-watcher.Failed():
			stop()
			return fmt.Errorf("controlplane: mesh file %s: %w", s.cfg.MeshFile, err)
		case <-watcher.Changes():
			st.reload(ctx)
			st.report()
		case <-s.server.Failed():
			stop()
			return fmt.Errorf("controlplane: xDS: %w", s.server.Err())
		case <-ctx.Done():
			stop()
			return ctx.Err()
		}
	}
}

// transportCredentials reads the TLS files; nil means plaintext.
func (s *Service) transportCredentials() (credentials.TransportCredentials, error) {
	t := s.cfg.TLS
	if t.CertFile == "" {
		return nil, nil
	}
	certPEM, err := boundedfile.Read(t.CertFile, boundedfile.MaxPEM)
	var keyPEM []byte
	if err == nil {
		keyPEM, err = boundedfile.Read(t.KeyFile, boundedfile.MaxPEM)
	}
	var cert tls.Certificate
	if err == nil {
		cert, err = tls.X509KeyPair(certPEM, keyPEM)
	}
	if err != nil {
		return nil, fmt.Errorf("controlplane: TLS certificate %s, key %s: %w", t.CertFile, t.KeyFile, err)
	}
	conf := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.ClientCAFile != "" {
		b, err := boundedfile.Read(t.ClientCAFile, boundedfile.MaxPEM)
		if err != nil {
			return nil, fmt.Errorf("controlplane: TLS client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("controlplane: TLS client CA %s: no PEM certificate in it", t.ClientCAFile)
		}
		conf.ClientCAs, conf.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return credentials.NewTLS(conf), nil
}

// nackPause is how long a NACK is held before go-control-plane answers it.
const nackPause = time.Second

// ErrBadToken: an xDS stream without the configured bearer token.
var ErrBadToken = errors.New("missing or wrong bearer token")

// checkToken refuses a stream that lacks the configured bearer token.
func (s *Service) checkToken(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if s.cfg.Token == "" {
		return handler(srv, ss)
	}
	md, _ := metadata.FromIncomingContext(ss.Context())
	for _, v := range md.Get("authorization") {
		if v == "Bearer "+s.cfg.Token {
			return handler(srv, ss)
		}
	}
	s.log.Warn("xDS stream refused", "method", info.FullMethod, "error", ErrBadToken)
	return status.Error(codes.Unauthenticated, "controlplane: "+ErrBadToken.Error())
}

// callbacks count the open streams and report rejected responses.
func (s *Service) callbacks() xds.Callbacks {
	open := func(_ context.Context, id int64, typeURL string) error {
		s.m.streams.Inc()
		s.log.Debug("xDS stream opened", "stream", id, "type", typeURL)
		return nil
	}
	closed := func(id int64, node *core.Node) {
		s.m.streams.Dec()
		s.log.Debug("xDS stream closed", "stream", id, "node", node.GetId())
	}
	// A rejected response is the one thing a client cannot tell us any
	// other way. go-control-plane answers a NACK at once with the same
	// snapshot (the client asks again with the last version it accepted),
	// so one resource a client refuses would spin client and server at full
	// speed: holding the NACK for a moment keeps the loop visible but cheap.
	nack := func(typeURL string, node *core.Node, detail string) {
		s.m.nacks.WithLabelValues(typeURL).Inc()
		s.log.Warn("xDS client rejected a response", "type", typeURL, "node", node.GetId(), "error", detail)
		<-s.clock.After(nackPause)
	}
	return xds.CallbackFuncs{
		StreamOpenFunc: open, StreamClosedFunc: closed,
		DeltaStreamOpenFunc: open, DeltaStreamClosedFunc: closed,
		StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
			if r.GetErrorDetail() != nil {
				nack(r.GetTypeUrl(), r.GetNode(), r.GetErrorDetail().GetMessage())
			}
			return nil
		},
		StreamDeltaRequestFunc: func(_ int64, r *discovery.DeltaDiscoveryRequest) error {
			if r.GetErrorDetail() != nil {
				nack(r.GetTypeUrl(), r.GetNode(), r.GetErrorDetail().GetMessage())
			}
			return nil
		},
	}
}

// classify sends NDS to the name table's cache and everything else to the
// snapshots. A type neither knows (istiod's ProxyConfig, say) gets no
// answer rather than a broken stream.
func classify(typeURL string) string {
	if typeURL == NameTableType {
		return "nds"
	}
	return "snapshot"
}

// nodeGroupHash maps every node to its group's snapshot: proxyless gRPC
// clients (node metadata GENERATOR=grpc, as Istio's gRPC bootstrap sets it)
// get API listeners; everything else gets a sidecar's configuration.
type nodeGroupHash struct{}

func (nodeGroupHash) ID(node *core.Node) string {
	if node.GetMetadata().GetFields()["GENERATOR"].GetStringValue() == "grpc" {
		return groupProxyless
	}
	return groupSidecar
}

// cacheLogger sends go-control-plane's logs to ours: its routine chatter at
// debug, its errors as warnings.
func (s *Service) cacheLogger() gcplog.Logger {
	debug := func(f string, a ...any) { s.log.Debug("xds: " + fmt.Sprintf(f, a...)) }
	return gcplog.LoggerFuncs{
		DebugFunc: debug, InfoFunc: debug,
		WarnFunc:  func(f string, a ...any) { s.log.Warn("xds: " + fmt.Sprintf(f, a...)) },
		ErrorFunc: func(f string, a ...any) { s.log.Warn("xds: " + fmt.Sprintf(f, a...)) },
	}
}

type metrics struct {
	reloads *prometheus.CounterVec
	nacks   *prometheus.CounterVec
	streams prometheus.Gauge
	version prometheus.Gauge

	all []prometheus.Collector // every one above, to register
}

func newMetrics() metrics {
	var mm messages.Metrics
	m := metrics{
		reloads: mm.CounterVec("controlplane_mesh_loads_total", "Mesh file loads, by result (applied, unchanged, rejected).", "result"),
		nacks:   mm.CounterVec("controlplane_xds_nacks_total", "Responses rejected by xDS clients, by type URL.", "type_url"),
		streams: mm.Gauge("controlplane_xds_streams", "Open xDS streams (SotW and delta)."),
		version: mm.Gauge("controlplane_snapshot_generation", "Generation of the snapshot served (0: none yet)."),
	}
	m.all = mm.Collectors()
	return m
}
