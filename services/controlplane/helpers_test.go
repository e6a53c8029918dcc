package controlplane

import (
	"path/filepath"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// server is a running control plane serving a mesh file in a temp dir.
type server struct {
	svc     *Service
	file    string
	health  *testkit.HealthRecorder
	logs    *testkit.LogBuffer
	serving *testkit.Serving
}

// startServer writes mesh to a temp file and serves it on a free loopback
// port; it returns once the service reports want (Ready, or Starting for a
// bad first file).
func startServer(t *testing.T, mesh []byte, want messages.HealthState, edit func(*Config)) *server {
	t.Helper()
	dir := t.TempDir()
	s := &server{file: filepath.Join(dir, "mesh.yaml"), health: &testkit.HealthRecorder{}, logs: testkit.NewLogBuffer(t)}
	testkit.WriteFile(t, s.file, mesh)
	cfg := NewConfig("127.0.0.1:0", s.file)
	if edit != nil {
		edit(&cfg)
	}
	svc, err := New(cfg, Inputs{}, Outputs{}, messages.NewRuntime(Name, s.health, nil, nil, s.logs.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	s.svc = svc
	s.start(t)
	s.health.WaitState(t, want, "")
	return s
}

func (s *server) start(t *testing.T) {
	t.Helper()
	s.serving = testkit.Serve(t, s.svc)
}

func (s *server) stop(t *testing.T) {
	t.Helper()
	s.serving.Stop(t)
}

// writeMesh replaces the file as most tools do: a new file renamed over it.
func (s *server) writeMesh(t *testing.T, mesh []byte) {
	t.Helper()
	testkit.ReplaceFile(t, s.file, mesh)
}

func (s *server) dial(t *testing.T, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	addr := s.svc.Addr()
	if addr == "" {
		t.Fatal("control plane is not listening")
	}
	return testkit.DialPlain(t, addr, opts...)
}

var sidecarNode = &core.Node{Id: "sidecar~127.0.0.1~demo-0.default~default.svc.cluster.local", Cluster: "demo.default"}

// sotwClient is an ADS client that behaves as Envoy does on a
// state-of-the-world stream: one request per type, ACK of each response.
type sotwClient struct {
	stream   grpc.BidiStreamingClient[discovery.DiscoveryRequest, discovery.DiscoveryResponse]
	resps    *testkit.Receiver[*discovery.DiscoveryResponse]
	pending  map[string][]*discovery.DiscoveryResponse // received, not yet asked for
	sentNode bool
}

func openSotW(t *testing.T, conn *grpc.ClientConn) *sotwClient {
	t.Helper()
	stream, cancel := testkit.OpenStream(t, discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources)
	return &sotwClient{stream: stream, resps: testkit.NewReceiver(t, cancel, stream.Recv),
		pending: map[string][]*discovery.DiscoveryResponse{}}
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
	for {
		r := c.resps.Next(t, "a "+typeURL+" response")
		if r.GetTypeUrl() == typeURL {
			return r
		}
		c.pending[r.GetTypeUrl()] = append(c.pending[r.GetTypeUrl()], r)
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
