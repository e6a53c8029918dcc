package xdsproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/grpcstop"
	"github.com/meshagent/meshagent/services/internal/uds"
	"github.com/meshagent/meshagent/services/xdsproxy/grpcbootstrap"
	"github.com/meshagent/meshagent/services/xdsproxy/protocol"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
	"github.com/meshagent/meshagent/services/xdsproxy/wasm"
)

// Inputs are what the proxy reads.
type Inputs struct {
	// Certs: the roots (Roots=RootsCertBundle) and the client certificate
	// (ClientCertificate) for TLS to the control plane. Read at every
	// connection, so a new bundle is used by the next one; new roots also
	// end the open upstream stream so that it is dialled again with them
	// (roots.go). May be nil when neither is configured.
	Certs messages.Latest[messages.CertBundle]
	// Workload is the VM workload's health (HealthUpdates): each change
	// between healthy and unhealthy is reported to the control plane. May
	// be nil otherwise.
	Workload messages.Latest[messages.WorkloadHealth]
}

// Outputs are what the proxy publishes. A nil sink discards.
type Outputs struct {
	// Names: the DNS name table from NDS (Config.NDS), in the order the
	// control plane sent them; a table that does not parse is NACKed and
	// never published.
	Names messages.Sink[messages.NameTable]
	// State: the upstream's state, for the status server.
	State messages.Sink[messages.XDSState]
	// Anchors: the ProxyConfig's caCertificatesPem (Config.ProxyConfigXDS),
	// for SDS's ROOTCA.
	Anchors messages.Sink[messages.TrustAnchors]
}

// Service is the XDS proxy.
type Service struct {
	cfg    Config
	in     Inputs
	out    Outputs
	health *messages.Reporter
	clock  messages.Clock
	log    *slog.Logger
	m      *metrics
	codec  rawxds.Codec
	// state is what the streams share; while Serve runs, its owner
	// goroutine alone touches it (owner.go), and it carries over to the
	// next run.
	state *proxyState
	warm  warmConn // a connection made ahead of its stream (warmconn.go)
	// wasm fetches the Wasm modules of ECDS responses (ecds.go); nil when
	// ECDS is forwarded unchanged. Its index outlives Serve.
	wasm *wasm.Cache

	streamIDs   atomic.Uint64 // for logs and cache nonces; never reset
	maxInflight atomic.Int64  // the most responses ever held at once by one stream

	// cacheLoaded: the cache file was read (once per Service). Serve's
	// own, and Serve never runs twice at once.
	cacheLoaded bool

	// wg counts the goroutines of a Serve run that outlive a stream's
	// handler (readers, responders): Serve returns after them.
	wg sync.WaitGroup
}

// server is one run of Serve as its gRPC handlers see it: the service, and
// the owner of its state for this run.
type server struct {
	svc *Service
	own *owner
}

// New returns the XDS proxy; an error for a bad Config or metrics that
// cannot be registered.
func New(cfg Config, in Inputs, out Outputs, rt messages.Runtime) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if rt.Health == nil {
		rt.Health = messages.NewReporter(Name, messages.Discard[messages.Health]{}, rt.Clock)
	}
	if rt.Clock == nil {
		rt.Clock = messages.SystemClock{}
	}
	if rt.Log == nil {
		rt.Log = slog.New(slog.DiscardHandler)
	}
	if out.Names == nil {
		out.Names = messages.Discard[messages.NameTable]{}
	}
	if out.State == nil {
		out.State = messages.Discard[messages.XDSState]{}
	}
	if out.Anchors == nil {
		out.Anchors = messages.Discard[messages.TrustAnchors]{}
	}
	if (cfg.Roots == RootsCertBundle && !cfg.Plaintext || cfg.ClientCertificate) && in.Certs == nil {
		return nil, fmt.Errorf("%w: Inputs.Certs is nil but the configuration needs the certificate bundle (Roots=%s, ClientCertificate=%t)",
			ErrBadConfig, cfg.Roots, cfg.ClientCertificate)
	}
	s := &Service{cfg: cfg, in: in, out: out, health: rt.Health, clock: rt.Clock, log: rt.Log, m: newMetrics(), codec: rawxds.NewCodec()}
	s.state = newProxyState(cfg, rt.Log, s.m, rt.Health, out.State)
	collectors := s.m.all
	if cfg.Wasm.Enabled() {
		s.wasm = wasm.NewCache(cfg.Wasm, rt.Clock, rt.Log.With("part", "wasm"))
		collectors = append(slices.Clip(collectors), s.wasm.Collectors()...)
	}
	if err := rt.Register(collectors...); err != nil {
		return nil, err
	}
	return s, nil
}

// String is the service's name.
func (s *Service) String() string { return Name }

// Serve listens on the XDS socket and proxies until ctx is done; then it
// ends every stream, stops the server, writes the cache and returns once
// every goroutine it started has, the state's owner last.
func (s *Service) Serve(ctx context.Context) error {
	s.health.Report(messages.Starting, "opening the XDS socket")
	if s.cfg.GRPCBootstrap.Path != "" {
		if err := grpcbootstrap.Write(s.cfg.GRPCBootstrap, s.cfg.SocketPath); err != nil {
			return err
		}
	}
	own := newOwner(s.state, s.clock)
	go own.run()
	defer own.stop()
	s.loadCache(own)
	lis, err := s.listen()
	if err != nil {
		return err
	}
	defer uds.Remove(s.cfg.SocketPath)

	srv := grpc.NewServer(s.serverOptions()...)
	srv.RegisterService(&adsServiceDesc, &server{svc: s, own: own})
	reflection.Register(srv)
	// Not ctx's child: the cache writer flushes after the streams have
	// ended (below), and ctx ends before they do.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	if s.watchesRoots() {
		// The baseline is read before any stream can dial (#26).
		roots, seen := s.rootsBaseline()
		bg.Add(1)
		go func() { defer bg.Done(); s.watchRoots(runCtx, own, roots, seen) }()
	}
	s.warmUp()
	defer s.warm.drop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()

	if s.wasm != nil {
		// Stopped after the streams: their ECDS workers ask it to the end.
		bg.Add(1)
		go func() { defer bg.Done(); s.wasm.Run(runCtx) }()
	}
	if s.cfg.HealthUpdates && s.in.Workload != nil {
		bg.Add(1)
		go func() { defer bg.Done(); s.watchWorkload(runCtx, own) }()
	}
	if s.cfg.OfflineCache && s.cfg.CacheFile != "" {
		bg.Add(1)
		go func() { defer bg.Done(); s.writeCache(runCtx, own) }()
	}
	s.log.Info("XDS proxy listening", "socket", s.cfg.SocketPath, "upstream", s.cfg.DiscoveryAddress,
		"tls", !s.cfg.Plaintext, "roots", s.cfg.rootsDescription(), "nds", s.cfg.NDS, "offline_cache", s.cfg.OfflineCache)
	own.idle()

	select {
	case <-ctx.Done():
		err = ctx.Err()
	case e := <-served:
		err = fmt.Errorf("serve XDS on %s: %w", s.cfg.SocketPath, e)
	}
	s.shutdown(srv, own)
	if errors.Is(err, ctx.Err()) {
		<-served
	}
	// The cache writer flushes last, once every stream has ended.
	cancel()
	bg.Wait()
	return err
}

// shutdown ends the active stream, stops the server (gracefully, within
// StopTimeout) and waits for the streams' goroutines.
func (s *Service) shutdown(srv *grpc.Server, own *owner) {
	own.shutdown()
	grpcstop.Within(srv, s.clock.After(s.cfg.StopTimeout))
	s.wg.Wait()
}

// records reports whether the cache takes this node's configuration.
func (s *Service) records(node string) bool {
	return s.cfg.OfflineCache && node != "" && node == s.cfg.NodeID
}

// noteInflight keeps the high-water mark of responses held by a stream.
func (s *Service) noteInflight(n int64) {
	for {
		m := s.maxInflight.Load()
		if n <= m || s.maxInflight.CompareAndSwap(m, n) {
			return
		}
	}
}

// watchWorkload reports each transition of the workload's health to the
// active stream, and keeps the last one for the next (Istio resends it
// on every new upstream stream).
func (s *Service) watchWorkload(ctx context.Context, own *owner) {
	var last *messages.WorkloadHealth
	for {
		h, ok, changed := s.in.Workload.Watch()
		if ok && (last == nil || last.Healthy != h.Healthy) {
			last = &h
			s.log.Info("workload health changed; reporting it to the control plane", "healthy", h.Healthy, "reason", h.Reason)
			own.workloadHealth(h)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// bundle is the latest certificate bundle, if any.
func (s *Service) bundle() (messages.CertBundle, bool) {
	if s.in.Certs == nil {
		return messages.CertBundle{}, false
	}
	return s.in.Certs.Get()
}

func (s *Service) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(s.codec),
		// Envoy's requests are bounded (maxRequestSize, socket.go); the
		// responses are not: a 10,000-cluster State of the World push is
		// past 10 MB.
		grpc.MaxRecvMsgSize(maxRequestSize),
		grpc.MaxSendMsgSize(maxMsgSize),
		// Each connection's peer uid and pid, for register (socket.go).
		grpc.Creds(peerCredentials{}),
		grpc.MaxConcurrentStreams(100000),
		// A push of thousands of clusters goes out in fewer, larger
		// writes (gRPC's default buffer is 32 KiB); one per connection.
		grpc.WriteBufferSize(256 << 10),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: s.cfg.KeepaliveInterval, Timeout: s.cfg.KeepaliveTimeout}),
		// Clients may ping as often as every half interval (Istio's
		// policy): a stricter one would close Envoy's connection with a
		// GOAWAY.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: s.cfg.KeepaliveInterval / 2, PermitWithoutStream: true}),
		grpc.StatsHandler(&recvMaxHandler{gauge: s.m.recvMax}),
	}
}

// adsServiceDesc is envoy.service.discovery.v3.AggregatedDiscoveryService
// with handlers that take raw responses (the generated server interface
// would force decoded ones).
var adsServiceDesc = grpc.ServiceDesc{
	ServiceName: adsService,
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{
		// State of the World.
		{
			StreamName: "StreamAggregatedResources",
			Handler: func(srv any, ss grpc.ServerStream) error {
				return serveStream[*discoveryv3.DiscoveryRequest](srv.(*server), protocol.SotW{}, ss)
			},
			ServerStreams: true, ClientStreams: true,
		},
		// Delta: what Istio configures Envoy to use.
		{
			StreamName: "DeltaAggregatedResources",
			Handler: func(srv any, ss grpc.ServerStream) error {
				return serveStream[*discoveryv3.DeltaDiscoveryRequest](srv.(*server), protocol.Delta{}, ss)
			},
			ServerStreams: true, ClientStreams: true,
		},
	},
	Metadata: "envoy/service/discovery/v3/ads.proto",
}
