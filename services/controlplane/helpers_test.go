package controlplane

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// waitFor bounds every wait in these tests: long enough for a loaded
// machine, short enough that a hang fails the test rather than the suite.
const waitFor = 15 * time.Second

// server is a running control plane serving a mesh file in a temp dir.
type server struct {
	svc    *Service
	file   string
	health *messages.Cell[messages.Health]
	logs   *testkit.LogBuffer
	cancel context.CancelFunc
	done   chan error
}

// startServer writes mesh to a temp file and serves it on a free loopback
// port; it returns once the service reports want (Ready, or Starting for a
// bad first file).
func startServer(t *testing.T, mesh []byte, want messages.HealthState, edit func(*Config)) *server {
	t.Helper()
	dir := t.TempDir()
	s := &server{file: filepath.Join(dir, "mesh.yaml"), health: messages.NewCell[messages.Health](), logs: &testkit.LogBuffer{}}
	if err := os.WriteFile(s.file, mesh, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig(s.file)
	cfg.Listen = "127.0.0.1:0"
	if edit != nil {
		edit(&cfg)
	}
	log := s.logs.Logger()
	svc, err := New(cfg, messages.NewRuntime(Name, s.health, nil, nil, log))
	if err != nil {
		t.Fatal(err)
	}
	s.svc = svc
	s.start(t)
	s.waitHealth(t, func(h messages.Health) bool { return h.State == want }, want.String())
	return s
}

func (s *server) start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan error, 1)
	go func() { s.done <- s.svc.Serve(ctx) }()
	t.Cleanup(func() { s.stop(t) })
}

func (s *server) stop(t *testing.T) {
	t.Helper()
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	select {
	case err := <-s.done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Serve returned %v, want context.Canceled", err)
		}
	case <-time.After(waitFor):
		t.Error("Serve did not return after cancel")
	}
}

// waitHealth waits until the latest report satisfies ok.
func (s *server) waitHealth(t *testing.T, ok func(messages.Health) bool, what string) messages.Health {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		h, set, changed := s.health.Watch()
		if set && ok(h) {
			return h
		}
		select {
		case <-changed:
		case err := <-s.done:
			t.Fatalf("Serve returned %v while waiting for %s", err, what)
		case <-deadline:
			t.Fatalf("health never %s; last %+v\nlogs:\n%s", what, h, s.logs)
		}
	}
}

// writeMesh replaces the file as most tools do: a new file renamed over it.
func (s *server) writeMesh(t *testing.T, mesh []byte) {
	t.Helper()
	tmp := s.file + ".tmp"
	if err := os.WriteFile(tmp, mesh, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, s.file); err != nil {
		t.Fatal(err)
	}
}

func (s *server) dial(t *testing.T, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	addr := s.svc.Addr()
	if addr == "" {
		t.Fatal("control plane is not listening")
	}
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

var sidecarNode = &core.Node{Id: "sidecar~127.0.0.1~demo-0.default~default.svc.cluster.local", Cluster: "demo.default"}

// sotwClient is an ADS client that behaves as Envoy does on a
// state-of-the-world stream: one request per type, ACK of each response.
type sotwClient struct {
	stream   grpc.BidiStreamingClient[discovery.DiscoveryRequest, discovery.DiscoveryResponse]
	resps    chan *discovery.DiscoveryResponse
	errc     chan error
	pending  map[string][]*discovery.DiscoveryResponse // received, not yet asked for
	sentNode bool
}

func openSotW(t *testing.T, conn *grpc.ClientConn) *sotwClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &sotwClient{stream: stream, resps: make(chan *discovery.DiscoveryResponse, 100), errc: make(chan error, 1),
		pending: map[string][]*discovery.DiscoveryResponse{}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			r, err := stream.Recv()
			if err != nil {
				c.errc <- err
				return
			}
			c.resps <- r
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return c
}

// request sends a request for typeURL; version and nonce are empty for the
// first, and those of the response being ACKed after.
func (c *sotwClient) request(t *testing.T, typeURL string, names []string, version, nonce string) {
	t.Helper()
	req := &discovery.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names, VersionInfo: version, ResponseNonce: nonce}
	if !c.sentNode {
		req.Node, c.sentNode = sidecarNode, true
	}
	if err := c.stream.Send(req); err != nil {
		t.Fatal(err)
	}
}

// next is the next response of typeURL, keeping others for later.
func (c *sotwClient) next(t *testing.T, typeURL string) *discovery.DiscoveryResponse {
	t.Helper()
	if q := c.pending[typeURL]; len(q) > 0 {
		c.pending[typeURL] = q[1:]
		return q[0]
	}
	deadline := time.After(waitFor)
	for {
		select {
		case r := <-c.resps:
			if r.GetTypeUrl() == typeURL {
				return r
			}
			c.pending[r.GetTypeUrl()] = append(c.pending[r.GetTypeUrl()], r)
		case err := <-c.errc:
			t.Fatalf("stream ended waiting for %s: %v", typeURL, err)
		case <-deadline:
			t.Fatalf("no %s response", typeURL)
		}
	}
}

// fetch requests typeURL and ACKs the response, as Envoy does.
func (c *sotwClient) fetch(t *testing.T, typeURL string, names []string) *discovery.DiscoveryResponse {
	t.Helper()
	c.request(t, typeURL, names, "", "")
	r := c.next(t, typeURL)
	c.request(t, typeURL, names, r.GetVersionInfo(), r.GetNonce())
	return r
}

// unpack decodes every resource of a response by name.
func unpack[T proto.Message](t *testing.T, anys []*anypb.Any, name func(T) string) map[string]T {
	t.Helper()
	out := map[string]T{}
	for _, a := range anys {
		m, err := a.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		v, ok := m.(T)
		if !ok {
			t.Fatalf("resource is %T", m)
		}
		out[name(v)] = v
	}
	return out
}
