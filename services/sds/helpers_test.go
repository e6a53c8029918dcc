package sds

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	sdsv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/messages"
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

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// waitLog waits until the log holds all of parts on one line.
func waitLog(t *testing.T, logs *syncBuffer, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, line := range strings.Split(logs.String(), "\n") {
			if containsAll(line, parts...) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q; log:\n%s", parts, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// server is an SDS service on a socket in a temp root. Its OS trust store
// and CRL are files under the root, so that tests write them.
type server struct {
	svc     *Service
	cfg     Config
	root    string
	certs   *messages.Cell[messages.CertBundle]
	anchors *messages.Cell[messages.TrustAnchors]
	health  *messages.Cell[messages.Health]
	logs    *syncBuffer
	cancel  context.CancelFunc
	done    chan error
}

// newServer makes a server, not started; configure may change its Config.
func newServer(t *testing.T, configure ...func(*Config)) *server {
	t.Helper()
	// A short root: unix socket paths are limited to 107 bytes.
	root, err := os.MkdirTemp("", "sds")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	s := &server{cfg: testConfig(root), root: root, certs: messages.NewCell[messages.CertBundle](),
		anchors: messages.NewCell[messages.TrustAnchors](), health: messages.NewCell[messages.Health](), logs: &syncBuffer{}}
	s.cfg.SystemRootFiles = []string{filepath.Join(root, "os/ssl/missing.crt"), filepath.Join(root, "os/ssl/ca-certificates.crt")}
	s.cfg.FileDebounce = 10 * time.Millisecond
	for _, f := range configure {
		f(&s.cfg)
	}
	svc, err := New(s.cfg, Inputs{Certs: s.certs, TrustAnchors: s.anchors},
		messages.NewRuntime(Name, s.health, nil, nil, slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
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

func (s *server) start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan error, 1)
	go func() { s.done <- s.svc.Serve(ctx) }()
	t.Cleanup(func() { s.stop(t) })
	deadline := time.After(10 * time.Second)
	for { // Ready, or Degraded when a test starts it with a bad file
		h, ok, changed := s.health.Watch()
		if ok && h.State.Serving() {
			return
		}
		select {
		case <-changed:
		case err := <-s.done:
			t.Fatalf("Serve returned %v before serving", err)
		case <-deadline:
			t.Fatal("SDS server never serving")
		}
	}
}

// waitHealth waits for the service's latest Health to be state with a
// reason holding reasonHas.
func (s *server) waitHealth(t *testing.T, state messages.HealthState, reasonHas string) messages.Health {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		h, ok, changed := s.health.Watch()
		if ok && h.State == state && strings.Contains(h.Reason, reasonHas) {
			return h
		}
		select {
		case <-changed:
		case err := <-s.done:
			t.Fatalf("Serve returned %v before %v %q", err, state, reasonHas)
		case <-deadline:
			t.Fatalf("health never %v with %q; latest %v %q", state, reasonHas, h.State, h.Reason)
		}
	}
}

func (s *server) stop(t *testing.T) {
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
	case <-time.After(15 * time.Second):
		t.Error("Serve did not return after cancel")
	}
	// What the tree's runner does when a service has stopped.
	s.svc.health.Report(messages.Stopped, "stopped")
}

// write writes a file under the server's root (rel) or at an absolute path.
func (s *server) write(t *testing.T, path string, data []byte) string {
	t.Helper()
	if !filepath.IsAbs(path) {
		path = filepath.Join(s.root, path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (s *server) client(t *testing.T) sdsv3.SecretDiscoveryServiceClient {
	t.Helper()
	return clientAt(t, s.cfg.SocketPath)
}

func clientAt(t *testing.T, path string) sdsv3.SecretDiscoveryServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return sdsv3.NewSecretDiscoveryServiceClient(conn)
}

// sotw is an SDS stream as Envoy uses it.
type sotw struct {
	stream grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]
	cancel context.CancelFunc
	resps  chan *discoveryv3.DiscoveryResponse
	errc   chan error
}

func (s *server) open(t *testing.T, names ...string) *sotw {
	t.Helper()
	return openStream(t, s.client(t), names...)
}

func openStream(t *testing.T, client sdsv3.SecretDiscoveryServiceClient, names ...string) *sotw {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := client.StreamSecrets(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &sotw{stream: stream, cancel: cancel, resps: make(chan *discoveryv3.DiscoveryResponse, 100), errc: make(chan error, 1)}
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
	c.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: SecretTypeURL, ResourceNames: names})
	return c
}

func (c *sotw) send(t *testing.T, r *discoveryv3.DiscoveryRequest) {
	t.Helper()
	if err := c.stream.Send(r); err != nil {
		t.Fatal(err)
	}
}

func (c *sotw) recv(t *testing.T) *discoveryv3.DiscoveryResponse {
	t.Helper()
	select {
	case r := <-c.resps:
		return r
	case err := <-c.errc:
		t.Fatalf("stream ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no SDS response")
	}
	return nil
}

// recvUntil receives (and ACKs, as Envoy does) until a response satisfies
// ok, and returns it.
func (c *sotw) recvUntil(t *testing.T, what string, names []string, ok func(*discoveryv3.DiscoveryResponse) bool) *discoveryv3.DiscoveryResponse {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-c.resps:
			c.ack(t, r, names...)
			if ok(r) {
				return r
			}
		case err := <-c.errc:
			t.Fatalf("stream ended waiting for %s: %v", what, err)
		case <-deadline:
			t.Fatalf("no SDS response with %s", what)
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
	select {
	case r := <-c.resps:
		t.Fatalf("unexpected push: version %s", r.VersionInfo)
	case err := <-c.errc:
		t.Fatalf("stream ended: %v", err)
	case <-time.After(d):
	}
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
	svc, err := New(cfg, Inputs{Certs: certs}, messages.NewRuntime(Name, health, nil, nil, log))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}
