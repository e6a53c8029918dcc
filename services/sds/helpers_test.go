package sds

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	sdsv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func bundle(n int) messages.CertBundle {
	return messages.CertBundle{
		CertChainPEM: []byte(fmt.Sprintf("chain-%d", n)),
		KeyPEM:       []byte(fmt.Sprintf("key-%d", n)),
		RootsPEM:     []byte("roots-1"),
		Expiry:       time.Now().Add(time.Hour),
		Version:      fmt.Sprintf("v%d", n),
	}
}

// server is an SDS service on a socket in a temp root. Its OS trust store
// and CRL are files under the root, so that tests write them.
type server struct {
	svc     *Service
	cfg     Config
	root    string
	certs   *messages.Cell[messages.CertBundle]
	anchors *messages.Cell[messages.TrustAnchors]
	health  *testkit.HealthRecorder
	logs    *testkit.LogBuffer
	serving *testkit.Serving
}

// newServer makes a server, not started; configure may change its Config.
func newServer(t *testing.T, configure ...func(*Config)) *server {
	t.Helper()
	root := testkit.ShortTempDir(t, "sds")
	s := &server{cfg: testConfig(t, root), root: root, certs: messages.NewCell[messages.CertBundle](),
		anchors: messages.NewCell[messages.TrustAnchors](), health: &testkit.HealthRecorder{}, logs: testkit.NewLogBuffer(t)}
	s.cfg.SystemRootFiles = []string{filepath.Join(root, "os/ssl/missing.crt"), filepath.Join(root, "os/ssl/ca-certificates.crt")}
	s.cfg.FileDebounce = 10 * time.Millisecond
	for _, f := range configure {
		f(&s.cfg)
	}
	svc, err := New(s.cfg, Inputs{Certs: s.certs, TrustAnchors: s.anchors}, Outputs{}, messages.NewRuntime(Name, s.health, nil, nil, s.logs.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	s.svc = svc
	return s
}

func startServer(t *testing.T, configure ...func(*Config)) *server {
	t.Helper()
	s := newServer(t, configure...)
	s.start(t)
	return s
}

// start serves and waits until the server serves: Ready, or Degraded when
// a test starts it with a bad file.
func (s *server) start(t *testing.T) {
	t.Helper()
	s.serving = testkit.Serve(t, s.svc)
	s.health.WaitLast(t, "the SDS server serving", func(h messages.Health) bool { return h.State.Serving() })
}

// waitHealth waits for the service's latest Health to be state with a
// reason holding reasonHas.
func (s *server) waitHealth(t *testing.T, state messages.HealthState, reasonHas string) messages.Health {
	t.Helper()
	return s.health.WaitState(t, state, reasonHas)
}

func (s *server) stop(t *testing.T) {
	t.Helper()
	s.serving.Stop(t)
	// What the tree's runner does when a service has stopped.
	s.svc.health.Report(messages.Stopped, "stopped")
}

// fileRoot is a DestinationRule's CA file: a fresh root written to
// etc/dr/ca.pem, and the name Envoy asks for it by.
func (s *server) fileRoot(t *testing.T) (ca *pki.CA, file, name string) {
	t.Helper()
	ca = pki.NewRoot(t, "dr ca")
	file = s.write(t, "etc/dr/ca.pem", ca.CertPEM)
	return ca, file, FileRootPrefix + file
}

// write writes a file under the server's root (rel) or at an absolute path.
func (s *server) write(t *testing.T, path string, data []byte) string {
	t.Helper()
	if !filepath.IsAbs(path) {
		path = filepath.Join(s.root, path)
	}
	testkit.WriteFile(t, path, data)
	return path
}

func (s *server) client(t *testing.T) sdsv3.SecretDiscoveryServiceClient {
	t.Helper()
	return clientAt(t, s.cfg.SocketPath)
}

func clientAt(t *testing.T, path string) sdsv3.SecretDiscoveryServiceClient {
	t.Helper()
	return sdsv3.NewSecretDiscoveryServiceClient(testkit.DialPlain(t, "unix://"+path))
}

// sotw is an SDS stream as Envoy uses it.
type sotw struct {
	stream grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]
	cancel context.CancelFunc
	resps  *testkit.Receiver[*discoveryv3.DiscoveryResponse]
}

func (s *server) open(t *testing.T, names ...string) *sotw {
	t.Helper()
	return openStream(t, s.client(t), names...)
}

func openStream(t *testing.T, client sdsv3.SecretDiscoveryServiceClient, names ...string) *sotw {
	t.Helper()
	stream, cancel := testkit.OpenStream(t, client.StreamSecrets)
	c := &sotw{stream: stream, cancel: cancel, resps: testkit.NewReceiver(t, cancel, stream.Recv)}
	c.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: SecretTypeURL, ResourceNames: names})
	return c
}

// openDelta opens a DeltaSecrets stream, ended at the end of the test,
// which then reads it to its end so that the server's side is gone too.
func (s *server) openDelta(t *testing.T) grpc.BidiStreamingClient[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse] {
	t.Helper()
	stream, cancel := testkit.OpenStream(t, s.client(t).DeltaSecrets)
	t.Cleanup(func() {
		cancel()
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	})
	return stream
}

func (c *sotw) send(t *testing.T, r *discoveryv3.DiscoveryRequest) {
	t.Helper()
	if err := c.stream.Send(r); err != nil {
		t.Fatal(err)
	}
}

func (c *sotw) recv(t *testing.T) *discoveryv3.DiscoveryResponse {
	t.Helper()
	return c.resps.Next(t, "an SDS response")
}

// recvUntil receives (and ACKs, as Envoy does) until a response satisfies
// ok, and returns it.
func (c *sotw) recvUntil(t *testing.T, what string, names []string, ok func(*discoveryv3.DiscoveryResponse) bool) *discoveryv3.DiscoveryResponse {
	t.Helper()
	for {
		r := c.resps.Next(t, "an SDS response with "+what)
		c.ack(t, r, names...)
		if ok(r) {
			return r
		}
	}
}

// collect receives (and ACKs) responses, merging them as Envoy does, until ok
// holds for what has been received, and returns that: the latest secret of
// each name, and the errors of the names whose latest response had one.
func (c *sotw) collect(t *testing.T, what string, names []string, ok func(map[string]*tlsv3.Secret, map[string]*status.Status) bool) (map[string]*tlsv3.Secret, map[string]*status.Status) {
	t.Helper()
	secrets, errs := map[string]*tlsv3.Secret{}, map[string]*status.Status{}
	c.recvUntil(t, what, names, func(r *discoveryv3.DiscoveryResponse) bool {
		got := decode(t, r)
		for n, s := range got {
			secrets[n] = s
			delete(errs, n)
		}
		for n, st := range resourceErrors(r) {
			errs[n] = st
		}
		return ok(secrets, errs)
	})
	return secrets, errs
}

func (c *sotw) ack(t *testing.T, r *discoveryv3.DiscoveryResponse, names ...string) {
	c.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: SecretTypeURL, ResourceNames: names, VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce})
}

// expectNothing checks that no response arrives for a while: used after an
// event that must not cause a push.
func (c *sotw) expectNothing(t *testing.T, d time.Duration) {
	t.Helper()
	c.resps.Quiet(t, "no push expected", d)
}

func decode(t *testing.T, r *discoveryv3.DiscoveryResponse) map[string]*tlsv3.Secret {
	t.Helper()
	out := map[string]*tlsv3.Secret{}
	for _, a := range r.Resources {
		s := &tlsv3.Secret{}
		if err := a.UnmarshalTo(s); err != nil {
			t.Fatal(err)
		}
		out[s.Name] = s
	}
	return out
}

func decodeAny(t *testing.T, a *anypb.Any) *tlsv3.Secret {
	t.Helper()
	s := &tlsv3.Secret{}
	if err := a.UnmarshalTo(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// resourceErrors are a response's errors by resource name.
func resourceErrors(r *discoveryv3.DiscoveryResponse) map[string]*status.Status {
	out := map[string]*status.Status{}
	for _, e := range r.GetResourceErrors() {
		out[e.GetResourceName().GetName()] = status.FromProto(e.GetErrorDetail())
	}
	return out
}

func trustedCA(s *tlsv3.Secret) string {
	return string(s.GetValidationContext().GetTrustedCa().GetInlineBytes())
}

func chainOf(s *tlsv3.Secret) string {
	return string(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
}

// newService is New with a test Runtime.
func newService(t testing.TB, cfg Config, certs messages.Latest[messages.CertBundle], health messages.Sink[messages.Health], log *slog.Logger) *Service {
	t.Helper()
	svc, err := New(cfg, Inputs{Certs: certs}, Outputs{}, messages.NewRuntime(Name, health, nil, nil, log))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}
