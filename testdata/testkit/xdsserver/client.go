package xdsserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// Client behaves like Envoy on an ADS stream, in either protocol: it
// subscribes (wildcard) to its types, decodes every resource, ACKs every
// response, and, when a stream ends, reconnects with what it holds
// (version_info in State of the World, initial_resource_versions in
// Delta), keeping its configuration across the reconnect as Envoy does.
type Client struct {
	opts   ClientOptions
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	done   chan struct{}

	sendMu sync.Mutex
	send   func(proto.Message) error // the current stream's

	// state is what tests read and wait on. Where a change of it goes
	// with one of mu's fields (record), mu is held around both: mu, then
	// state's own lock.
	state *testkit.Observed[State]

	mu        sync.Mutex
	gateOpen  chan struct{}                // closed while the client reads; Pause replaces it
	resources map[string]map[string]string // type → name → version
	lastNonce map[string]string
	// names: State of the World, the names Subscribe asked for, by type:
	// Envoy repeats them in every request of the type, ACKs included.
	names map[string][]string
	// kept: type → name → resource, for the types of ClientOptions.Keep.
	kept map[string]map[string]*anypb.Any
}

// ClientOptions configure a Client.
type ClientOptions struct {
	// Target is what grpc.NewClient dials: "unix:///path/to/XDS" or
	// host:port.
	Target string
	Delta  bool
	Node   *corev3.Node
	// Types are subscribed to, wildcard, in this order (default CDS, LDS).
	Types []string
	// Reconnect after a stream ends, after ReconnectDelay (default 10ms).
	Reconnect      bool
	ReconnectDelay time.Duration
	// DialOptions replace the default (plaintext).
	DialOptions []grpc.DialOption
	// Keep: the types whose resources the client keeps (Kept), besides
	// their names and versions.
	Keep []string
	// Files is where the client finds the Wasm modules its resources name
	// (CheckWasm).
	Files FileRoot
}

// State is what the client holds and has seen.
type State struct {
	Versions  map[string]string // by type: the last version accepted
	Counts    map[string]int    // by type: how many resources it holds
	Responses map[string]int    // by type: responses received
	Nonces    map[string]string // by type: nonce of the last response
	// Streams opened; Ends, why each stream ended.
	Streams int
	Ends    []error
	// DecodeErrors counts resources that did not decode (they are NACKed).
	DecodeErrors int
}

func (s State) clone() State {
	c := s
	c.Versions, c.Counts, c.Responses, c.Nonces = maps.Clone(s.Versions), maps.Clone(s.Counts), maps.Clone(s.Responses), maps.Clone(s.Nonces)
	c.Ends = append([]error(nil), s.Ends...)
	return c
}

// NewClient connects and starts the client's stream.
func NewClient(opts ClientOptions) (*Client, error) {
	if len(opts.Types) == 0 {
		opts.Types = []string{resource.ClusterType, resource.ListenerType}
	}
	if opts.ReconnectDelay == 0 {
		opts.ReconnectDelay = 10 * time.Millisecond
	}
	if opts.Node == nil {
		opts.Node = &corev3.Node{Id: "sidecar~127.0.0.1~test.default~default.svc.cluster.local", Cluster: "test"}
	}
	dial := opts.DialOptions
	if dial == nil {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1 << 30))}
	}
	conn, err := grpc.NewClient(opts.Target, dial...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	open := make(chan struct{})
	close(open)
	c := &Client{
		opts: opts, conn: conn, cancel: cancel, done: make(chan struct{}), gateOpen: open,
		state:     testkit.NewObserved(State{Versions: map[string]string{}, Counts: map[string]int{}, Responses: map[string]int{}, Nonces: map[string]string{}}, State.clone),
		resources: map[string]map[string]string{}, lastNonce: map[string]string{}, names: map[string][]string{},
		kept: map[string]map[string]*anypb.Any{},
	}
	go c.run(ctx)
	return c, nil
}

// Close ends the stream and the connection, and waits for the client.
func (c *Client) Close() {
	c.cancel()
	c.Resume()
	<-c.done
	_ = c.conn.Close()
}

// State returns a copy of what the client holds.
func (c *Client) State() State { return c.state.Get() }

// Resources returns the names and versions held for a type.
func (c *Client) Resources(typeURL string) map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.resources[typeURL])
}

// Kept returns the resources held for a type of ClientOptions.Keep.
func (c *Client) Kept(typeURL string) map[string]*anypb.Any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.kept[typeURL])
}

// WaitFor waits until cond holds, or ctx ends.
func (c *Client) WaitFor(ctx context.Context, cond func(State) bool) error {
	return c.state.WaitFor(ctx, "xds client", cond)
}

// Pause stops reading responses (a slow Envoy); Resume reads again.
func (c *Client) Pause() {
	c.mu.Lock()
	c.gateOpen = make(chan struct{})
	c.mu.Unlock()
}

// Resume undoes Pause.
func (c *Client) Resume() {
	c.mu.Lock()
	select {
	case <-c.gateOpen:
	default:
		close(c.gateOpen)
	}
	c.mu.Unlock()
}

// Subscribe sends one more request on the current stream: in State of
// the World, names for typeURL (with the version and nonce it holds); in
// Delta, a subscription to names.
func (c *Client) Subscribe(typeURL string, names []string) error {
	c.mu.Lock()
	version, nonce := c.state.Get().Versions[typeURL], c.lastNonce[typeURL]
	c.names[typeURL] = names
	c.mu.Unlock()
	var req proto.Message
	if c.opts.Delta {
		req = &discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL, ResourceNamesSubscribe: names}
	} else {
		req = &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names, VersionInfo: version, ResponseNonce: nonce}
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.send == nil {
		return errors.New("xds client: no stream")
	}
	return c.send(req)
}

func (c *Client) run(ctx context.Context) {
	defer close(c.done)
	for {
		err := c.stream(ctx)
		c.state.Update(func(s *State) { s.Ends = append(s.Ends, err) })
		if !c.opts.Reconnect || ctx.Err() != nil {
			return
		}
		select {
		case <-time.After(c.opts.ReconnectDelay):
		case <-ctx.Done():
			return
		}
	}
}

// stream runs one stream until it ends.
func (c *Client) stream(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	method := "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
	if c.opts.Delta {
		method = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
	}
	cs, err := c.conn.NewStream(sctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return err
	}
	c.sendMu.Lock()
	c.send = func(m proto.Message) error { return cs.SendMsg(m) }
	c.sendMu.Unlock()
	defer func() {
		c.sendMu.Lock()
		c.send = nil
		c.sendMu.Unlock()
	}()
	c.state.Update(func(s *State) { s.Streams++ })
	versions := c.state.Get().Versions
	for i, t := range c.opts.Types {
		c.mu.Lock()
		var req proto.Message
		if c.opts.Delta {
			r := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: t, InitialResourceVersions: maps.Clone(c.resources[t])}
			if i == 0 {
				r.Node = c.opts.Node
			}
			req = r
		} else {
			r := &discoveryv3.DiscoveryRequest{TypeUrl: t, VersionInfo: versions[t]}
			if i == 0 {
				r.Node = c.opts.Node
			}
			req = r
		}
		c.mu.Unlock()
		if err := c.sendLocked(req); err != nil {
			return c.endOf(cs, err)
		}
	}
	for {
		c.mu.Lock()
		gate := c.gateOpen
		c.mu.Unlock()
		select {
		case <-gate:
		case <-sctx.Done():
			return sctx.Err()
		}
		var ack proto.Message
		if c.opts.Delta {
			var resp discoveryv3.DeltaDiscoveryResponse
			if err := cs.RecvMsg(&resp); err != nil {
				return err
			}
			ack = c.applyDelta(&resp)
		} else {
			var resp discoveryv3.DiscoveryResponse
			if err := cs.RecvMsg(&resp); err != nil {
				return err
			}
			ack = c.applySotW(&resp)
		}
		if err := c.sendLocked(ack); err != nil {
			return c.endOf(cs, err)
		}
	}
}

// endOf is why the stream ended when a send on it failed with err: grpc's
// SendMsg returns io.EOF once the server has ended the stream (a refused
// token, say), and the stream's status then comes from RecvMsg.
func (c *Client) endOf(cs grpc.ClientStream, err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	for {
		var m proto.Message = &discoveryv3.DiscoveryResponse{}
		if c.opts.Delta {
			m = &discoveryv3.DeltaDiscoveryResponse{}
		}
		if err := cs.RecvMsg(m); err != nil {
			return err
		}
	}
}

func (c *Client) sendLocked(m proto.Message) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.send == nil {
		return errors.New("xds client: no stream")
	}
	return c.send(m)
}

// decode checks a resource as Envoy would: it must decode as its type,
// and its Wasm code be a local module (CheckWasm).
func decode(a *anypb.Any, files FileRoot) (string, error) {
	m, err := a.UnmarshalNew()
	if err != nil {
		return "", err
	}
	if err := CheckWasm(a, files); err != nil {
		return "", err
	}
	if n, ok := m.(interface{ GetName() string }); ok && n.GetName() != "" {
		return n.GetName(), nil
	}
	if n, ok := m.(interface{ GetClusterName() string }); ok {
		return n.GetClusterName(), nil
	}
	return "", fmt.Errorf("resource of type %s has no name", a.GetTypeUrl())
}

func (c *Client) applySotW(r *discoveryv3.DiscoveryResponse) proto.Message {
	t := r.GetTypeUrl()
	held := make(map[string]string, len(r.GetResources()))
	bodies := map[string]*anypb.Any{}
	var bad error
	for _, a := range r.GetResources() {
		name, err := decode(a, c.opts.Files)
		if err != nil {
			bad = err
			break
		}
		held[name] = r.GetVersionInfo()
		bodies[name] = a
	}
	detail, version := c.record(t, r.GetNonce(), bad, func(s *State) {
		c.resources[t] = held
		if slices.Contains(c.opts.Keep, t) {
			c.kept[t] = bodies
		}
		s.Versions[t], s.Counts[t] = r.GetVersionInfo(), len(held)
	})
	c.mu.Lock()
	names := c.names[t]
	c.mu.Unlock()
	return &discoveryv3.DiscoveryRequest{TypeUrl: t, ResourceNames: names, ResponseNonce: r.GetNonce(), VersionInfo: version, ErrorDetail: detail}
}

func (c *Client) applyDelta(r *discoveryv3.DeltaDiscoveryResponse) proto.Message {
	t := r.GetTypeUrl()
	type upd struct {
		name, version string
		body          *anypb.Any
	}
	var ups []upd
	var bad error
	for _, res := range r.GetResources() {
		if res.GetResource() == nil {
			continue
		}
		if _, err := decode(res.GetResource(), c.opts.Files); err != nil {
			bad = err
			break
		}
		ups = append(ups, upd{res.GetName(), res.GetVersion(), res.GetResource()})
	}
	detail, _ := c.record(t, r.GetNonce(), bad, func(s *State) {
		held := c.resources[t]
		if held == nil {
			held = map[string]string{}
			c.resources[t] = held
		}
		keep := slices.Contains(c.opts.Keep, t)
		if keep && c.kept[t] == nil {
			c.kept[t] = map[string]*anypb.Any{}
		}
		for _, u := range ups {
			held[u.name] = u.version
			if keep {
				c.kept[t][u.name] = u.body
			}
		}
		for _, n := range r.GetRemovedResources() {
			delete(held, n)
			delete(c.kept[t], n)
		}
		s.Versions[t], s.Counts[t] = r.GetSystemVersionInfo(), len(held)
	})
	return &discoveryv3.DeltaDiscoveryRequest{TypeUrl: t, ResponseNonce: r.GetNonce(), ErrorDetail: detail}
}

// record counts a response of type t and keeps its nonce for the next
// request. Unless bad (a resource did not decode: the response is NACKed,
// and detail says why), apply changes the state by it. version is the
// type's version after: the new one, or the one still held after a NACK.
func (c *Client) record(t, nonce string, bad error, apply func(*State)) (detail *rpcstatus.Status, version string) {
	c.mu.Lock() // apply and lastNonce write mu's fields
	defer c.mu.Unlock()
	c.state.Update(func(s *State) {
		c.lastNonce[t] = nonce
		s.Responses[t]++
		s.Nonces[t] = nonce
		if bad != nil {
			s.DecodeErrors++
			detail = statusOf(bad)
		} else {
			apply(s)
		}
		version = s.Versions[t]
	})
	return detail, version
}

func statusOf(err error) *rpcstatus.Status {
	return &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
}
