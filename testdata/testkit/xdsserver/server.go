// Package xdsserver is a real xDS control plane for tests and benchmarks,
// built on go-control-plane: its snapshot cache serves CDS, EDS, LDS and
// RDS (and SDS secrets, for Envoy's sds-grpc pipe), linear caches serve
// Istio's NDS name table and ProxyConfig, both protocols (State of the
// World and Delta) over ADS on TCP loopback or a unix socket, plaintext or
// TLS, with an optional bearer-token check. It can be stopped
// and restarted on the same address (outages), and counts what it sees.
package xdsserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/messages/nds"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// Istio's type URLs for the agent's own types.
const (
	NameTableType   = resource.APITypePrefix + "istio.networking.nds.v1.NameTable"
	ProxyConfigType = resource.APITypePrefix + "istio.mesh.v1alpha1.ProxyConfig"
	HealthInfoType  = resource.APITypePrefix + "istio.v1.HealthInformation"
)

// Options configure a Server.
type Options struct {
	// Addr is host:port to listen on (default 127.0.0.1:0), or
	// unix:PATH for a unix socket (Envoy's xds-grpc pipe).
	Addr string
	// TLS, when set, serves TLS with this configuration.
	TLS *tls.Config
	// Token, when set, is required on every stream as
	// "authorization: Bearer <Token>"; a stream without it fails with
	// Unauthenticated, as istiod's does.
	Token string
	// ByNode keeps a snapshot per node id (SetNodeSnapshot): a push then
	// reaches one client only, as benchmarks need. Otherwise every node
	// gets the one snapshot of SetSnapshot.
	ByNode bool
}

// Server is a running control plane.
type Server struct {
	opts  Options
	snaps cachev3.SnapshotCache
	// secrets serves SDS from the same snapshots, outside ADS mode: Envoy
	// asks for each secret on a stream of its own (an SdsApi each), and the
	// ADS-mode cache answers a stream only when it names every secret.
	secrets cachev3.SnapshotCache
	nds     *cachev3.LinearCache
	pcfg    *cachev3.LinearCache
	cache   cachev3.Cache

	hang atomic.Bool // new streams are read and never answered
	// refuse: streams past the next refuseAfter fail with it (RefuseAfter).
	refuse      error
	refuseAfter int

	mu     sync.Mutex
	addr   string
	grpc   *grpc.Server
	cancel context.CancelFunc
	served chan struct{}
	stats  *testkit.Observed[Stats]
}

// Stats are what the server has seen since it was created (a restart
// keeps counting).
type Stats struct {
	Streams      int // State of the World streams opened
	DeltaStreams int
	Rejected     int            // streams refused (token)
	Hung         int            // requests read on streams that are never answered (Hang)
	Requests     map[string]int // by type URL
	ACKs         map[string]int
	NACKs        map[string]int
	LastNACK     map[string]string // error_detail message of the last NACK, by type URL
	// Health is every HealthInformation request, in order: "" when
	// healthy, else its error_detail message.
	Health []string
	// Metadata of the last stream opened.
	Metadata metadata.MD
	// Nonces: every response_nonce received (ACKs and NACKs), by type URL.
	Nonces map[string][]string
	// What the last stream opened asks for, by type URL (the control
	// plane's view of its subscriptions). Subscribed: State of the World,
	// the resource names of its last request; Delta, the names it
	// subscribed to less those it unsubscribed from, "*" included when
	// subscribed explicitly. Initial: of its first request of the type,
	// version_info (State of the World) or initial_resource_versions
	// (Delta, name → version).
	Subscribed     map[string][]string
	InitialVersion map[string]string
	Initial        map[string]map[string]string
	stream         int64
}

func (s Stats) clone() Stats {
	c := s
	c.Requests, c.ACKs, c.NACKs = cloneMap(s.Requests), cloneMap(s.ACKs), cloneMap(s.NACKs)
	c.LastNACK = cloneMap(s.LastNACK)
	c.Health = append([]string(nil), s.Health...)
	c.Metadata = s.Metadata.Copy()
	c.Nonces, c.Subscribed = map[string][]string{}, map[string][]string{}
	for t, n := range s.Nonces {
		c.Nonces[t] = append([]string(nil), n...)
	}
	for t, n := range s.Subscribed {
		c.Subscribed[t] = append([]string(nil), n...)
	}
	c.InitialVersion, c.Initial = cloneMap(s.InitialVersion), map[string]map[string]string{}
	for t, m := range s.Initial {
		c.Initial[t] = cloneMap(m)
	}
	return c
}

func cloneMap[V any](m map[string]V) map[string]V {
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// anyNode serves every node the same snapshot.
type anyNode struct{}

func (anyNode) ID(*corev3.Node) string { return "any" }

// Start listens and serves.
func Start(opts Options) (*Server, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	var hash cachev3.NodeHash = anyNode{}
	if opts.ByNode {
		hash = cachev3.IDHash{}
	}
	s := &Server{
		opts:    opts,
		snaps:   cachev3.NewSnapshotCache(true, hash, nil),
		secrets: cachev3.NewSnapshotCache(false, hash, nil),
		nds:     cachev3.NewLinearCache(NameTableType, cachev3.WithVersionPrefix("nds-")),
		pcfg:    cachev3.NewLinearCache(ProxyConfigType, cachev3.WithVersionPrefix("pc-")),
		stats: testkit.NewObserved(Stats{Requests: map[string]int{}, ACKs: map[string]int{}, NACKs: map[string]int{},
			LastNACK: map[string]string{}, Nonces: map[string][]string{}}, Stats.clone),
	}
	byType := func(t string) string {
		switch t {
		case NameTableType, ProxyConfigType, HealthInfoType:
			return t
		case resource.SecretType:
			return "secrets"
		}
		return "snapshot"
	}
	s.cache = &cachev3.MuxCache{
		Classify:      func(r *cachev3.Request) string { return byType(r.GetTypeUrl()) },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string { return byType(r.GetTypeUrl()) },
		Caches: map[string]cachev3.Cache{
			"snapshot": s.snaps, "secrets": s.secrets, NameTableType: s.nds, ProxyConfigType: s.pcfg,
			HealthInfoType: silent{},
		},
	}
	if err := s.start(opts.Addr); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) start(addr string) error {
	network, where := "tcp", addr
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, where = "unix", path
	}
	lis, err := net.Listen(network, where)
	if err != nil {
		return fmt.Errorf("xdsserver: listen %s: %w", addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	xds := serverv3.NewServer(ctx, s.cache, serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, id int64, _ string) error {
			s.stats.Update(func(st *Stats) { st.Streams++; st.opened(ctx, id) })
			return nil
		},
		DeltaStreamOpenFunc: func(ctx context.Context, id int64, _ string) error {
			s.stats.Update(func(st *Stats) { st.DeltaStreams++; st.opened(ctx, id) })
			return nil
		},
		StreamRequestFunc: func(id int64, r *discoveryv3.DiscoveryRequest) error {
			s.observe(id, r.GetTypeUrl(), r.GetResponseNonce(), r.GetErrorDetail(), func(st *Stats, t string) {
				if _, ok := st.Subscribed[t]; !ok {
					st.InitialVersion[t] = r.GetVersionInfo()
				}
				st.Subscribed[t] = append([]string{}, r.GetResourceNames()...)
			})
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, r *discoveryv3.DeltaDiscoveryRequest) error {
			s.observe(id, r.GetTypeUrl(), r.GetResponseNonce(), r.GetErrorDetail(), func(st *Stats, t string) {
				names, ok := st.Subscribed[t]
				if !ok {
					st.Initial[t] = cloneMap(r.GetInitialResourceVersions())
					names = []string{}
				}
				names = append(names, r.GetResourceNamesSubscribe()...)
				names = slices.DeleteFunc(names, func(n string) bool { return slices.Contains(r.GetResourceNamesUnsubscribe(), n) })
				slices.Sort(names)
				st.Subscribed[t] = slices.Compact(names)
			})
			return nil
		},
	})
	opts := []grpc.ServerOption{
		grpc.ChainStreamInterceptor(s.checkToken, s.refuses, s.hangs),
		// As istiod: keepalive pings every 15 s are welcome (grpc-go's
		// default of 5 minutes resets an agent's stream after ~2 minutes).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 15 * time.Second}),
	}
	if s.opts.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.opts.TLS)))
	}
	gs := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, xds)
	secretv3.RegisterSecretDiscoveryServiceServer(gs, xds)
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(lis) }()
	s.mu.Lock()
	s.addr, s.grpc, s.cancel, s.served = lis.Addr().String(), gs, cancel, served
	s.mu.Unlock()
	return nil
}

// observe records one request of stream id, SotW or Delta: its nonce and
// verdict whatever the stream, and, on the latest stream, what it
// subscribes to (subscribe, under the stats lock), health reports aside.
func (s *Server) observe(id int64, typeURL, nonce string, nack *rpcstatus.Status, subscribe func(st *Stats, typeURL string)) {
	s.request(typeURL, nonce, nack.GetMessage(), nack != nil)
	s.stats.Update(func(st *Stats) {
		if id == st.stream && typeURL != HealthInfoType {
			subscribe(st, typeURL)
		}
	})
}

func (s *Server) checkToken(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if s.opts.Token == "" {
		return h(srv, ss)
	}
	md, _ := metadata.FromIncomingContext(ss.Context())
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+s.opts.Token {
		s.stats.Update(func(st *Stats) { st.Rejected++ })
		return status.Error(codes.Unauthenticated, "authentication failure: bad or missing bearer token")
	}
	return h(srv, ss)
}

// Hang makes the streams opened from now on hang: their requests are read
// and never answered, a control plane alive on the wire and dead inside
// (istio/istio#57064). Streams already open are not affected.
func (s *Server) Hang(on bool) { s.hang.Store(on) }

// RefuseAfter serves the next n streams, then refuses those that follow
// with err (a control plane that answers one stream and fails the next:
// it is going away again); a nil err serves every stream again.
func (s *Server) RefuseAfter(n int, err error) {
	s.mu.Lock()
	s.refuse, s.refuseAfter = err, n
	s.mu.Unlock()
}

func (s *Server) refuses(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	s.mu.Lock()
	err := s.refuse
	if err != nil && s.refuseAfter > 0 {
		s.refuseAfter--
		err = nil
	}
	s.mu.Unlock()
	if err != nil {
		s.stats.Update(func(st *Stats) { st.Rejected++ })
		return err
	}
	return h(srv, ss)
}

func (s *Server) hangs(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if !s.hang.Load() {
		return h(srv, ss)
	}
	for {
		if err := ss.RecvMsg(new(emptypb.Empty)); err != nil {
			return err
		}
		s.stats.Update(func(st *Stats) { st.Hung++ })
	}
}

// opened: stream id is the last opened, with the metadata of ctx.
func (st *Stats) opened(ctx context.Context, id int64) {
	st.Metadata, _ = metadata.FromIncomingContext(ctx)
	st.stream = id
	st.Subscribed, st.InitialVersion, st.Initial = map[string][]string{}, map[string]string{}, map[string]map[string]string{}
}

func (s *Server) request(typeURL, nonce, nack string, isNACK bool) {
	s.stats.Update(func(st *Stats) {
		st.Requests[typeURL]++
		if typeURL == HealthInfoType {
			st.Health = append(st.Health, nack)
			return
		}
		if nonce == "" {
			return
		}
		st.Nonces[typeURL] = append(st.Nonces[typeURL], nonce)
		if isNACK {
			st.NACKs[typeURL]++
			st.LastNACK[typeURL] = nack
		} else {
			st.ACKs[typeURL]++
		}
	})
}

// Addr is the address the server listens on.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Stats returns a copy of the counters.
func (s *Server) Stats() Stats { return s.stats.Get() }

// WaitFor waits until cond holds for the counters, or ctx ends.
func (s *Server) WaitFor(ctx context.Context, cond func(Stats) bool) error {
	return s.stats.WaitFor(ctx, "xdsserver", cond)
}

// Stop closes every connection at once (a crashed control plane).
func (s *Server) Stop() {
	s.mu.Lock()
	gs, cancel, served := s.grpc, s.cancel, s.served
	s.grpc = nil
	s.mu.Unlock()
	if gs == nil {
		return
	}
	gs.Stop()
	cancel()
	<-served
}

// Restart serves again on the same address, with the same configuration.
func (s *Server) Restart() error {
	s.Stop()
	return s.start(s.Addr())
}

// SetSnapshot replaces the configuration; nameTable, when not nil, also
// replaces the NDS table. Resources may be nil.
func (s *Server) SetSnapshot(version string, clusters, listeners, routes, endpoints []types.Resource, nameTable *nds.NameTable) error {
	if err := s.SetNodeSnapshot("any", version, clusters, listeners, routes, endpoints); err != nil {
		return err
	}
	if nameTable != nil {
		return s.SetNameTable(nameTable)
	}
	return nil
}

// SetNodeSnapshot replaces the configuration of one node (Options.ByNode).
func (s *Server) SetNodeSnapshot(node, version string, clusters, listeners, routes, endpoints []types.Resource) error {
	return s.setResources(node, version, map[resource.Type][]types.Resource{
		resource.ClusterType:  clusters,
		resource.ListenerType: listeners,
		resource.RouteType:    routes,
		resource.EndpointType: endpoints,
	})
}

// SetResources replaces the configuration with resources of any of the
// snapshot's types (secrets too, for an SDS client); a type left out is
// served empty. Like SetSnapshot, it is for a server without
// Options.ByNode.
func (s *Server) SetResources(version string, resources map[resource.Type][]types.Resource) error {
	return s.setResources("any", version, resources)
}

func (s *Server) setResources(node, version string, resources map[resource.Type][]types.Resource) error {
	snap, err := cachev3.NewSnapshot(version, resources)
	if err != nil {
		return err
	}
	if err := s.secrets.SetSnapshot(context.Background(), node, snap); err != nil {
		return err
	}
	return s.snaps.SetSnapshot(context.Background(), node, snap)
}

// Clear drops the configuration of SetSnapshot or SetResources: requests
// wait unanswered, as they do at a control plane that has nothing for the
// node yet.
func (s *Server) Clear() {
	s.snaps.ClearSnapshot("any")
	s.secrets.ClearSnapshot("any")
}

// SetNameTable replaces the NDS table. Any message may be given, to send
// a table that does not decode.
func (s *Server) SetNameTable(t proto.Message) error {
	return s.nds.UpdateResource("nametable", t)
}

// SetProxyConfig replaces the ProxyConfig served over xDS.
func (s *Server) SetProxyConfig(pc *meshconfig.ProxyConfig) error {
	return s.pcfg.UpdateResource("proxyconfig", pc)
}

// Close stops the server for good.
func (s *Server) Close() { s.Stop() }

// silent takes HealthInformation requests and never answers (istiod
// records them; there is nothing to send back).
type silent struct{}

func (silent) CreateWatch(*cachev3.Request, cachev3.Subscription, chan cachev3.Response) (func(), error) {
	return func() {}, nil
}

func (silent) CreateDeltaWatch(*cachev3.DeltaRequest, cachev3.Subscription, chan cachev3.DeltaResponse) (func(), error) {
	return func() {}, nil
}

func (silent) Fetch(context.Context, *cachev3.Request) (cachev3.Response, error) {
	return nil, errors.New("xdsserver: HealthInformation cannot be fetched")
}
