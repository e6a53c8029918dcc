package sds

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	sdsv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"go.uber.org/goleak"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

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

type healthCell = messages.Cell[messages.Health]

// server is a running SDS service on a socket in a temp root.
type server struct {
	svc    *Service
	cfg    Config
	certs  *messages.Cell[messages.CertBundle]
	health *healthCell
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan error
}

func startServer(t *testing.T) *server {
	t.Helper()
	// A short root: unix socket paths are limited to 107 bytes.
	root, err := os.MkdirTemp("", "sds")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	s := &server{cfg: NewConfig(filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket")), certs: messages.NewCell[messages.CertBundle](),
		health: messages.NewCell[messages.Health](), logs: &syncBuffer{}}
	s.svc = newService(t, s.cfg, s.certs, s.health, slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	s.start(t)
	return s
}

func (s *server) start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan error, 1)
	go func() { s.done <- s.svc.Serve(ctx) }()
	deadline := time.After(10 * time.Second)
	for {
		h, ok, changed := s.health.Watch()
		if ok && h.State == messages.Ready {
			break
		}
		select {
		case <-changed:
		case err := <-s.done:
			t.Fatalf("Serve returned %v before Ready", err)
		case <-deadline:
			t.Fatal("SDS server never Ready")
		}
	}
	t.Cleanup(func() { s.stop(t) })
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

func (s *server) client(t *testing.T) sdsv3.SecretDiscoveryServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+s.cfg.SocketPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
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
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := s.client(t).StreamSecrets(ctx)
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

func TestHeldUntilFirstBundleThenPushedOnSameStream(t *testing.T) {
	s := startServer(t)
	c := s.open(t, WorkloadKeyCertResourceName)
	c.expectNothing(t, 200*time.Millisecond)
	s.certs.Send(bundle(1))
	r := c.recv(t)
	sec := decode(t, r)[WorkloadKeyCertResourceName]
	if r.VersionInfo != "v1" || string(sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes()) != "chain-1" ||
		string(sec.GetTlsCertificate().GetPrivateKey().GetInlineBytes()) != "key-1" || r.TypeUrl != SecretTypeURL {
		t.Fatalf("first response: %v", r)
	}
	c.ack(t, r, WorkloadKeyCertResourceName)
	c.expectNothing(t, 100*time.Millisecond) // an ACK is not answered

	s.certs.Send(bundle(2))
	r = c.recv(t)
	if r.VersionInfo != "v2" || string(decode(t, r)[WorkloadKeyCertResourceName].GetTlsCertificate().GetCertificateChain().GetInlineBytes()) != "chain-2" {
		t.Fatalf("push: %v", r)
	}
	// The same bundle again is not pushed.
	s.certs.Send(bundle(2))
	c.expectNothing(t, 100*time.Millisecond)
}

func TestRootsOnlySubscriberNotPushedForLeafRenewal(t *testing.T) {
	s := startServer(t)
	s.certs.Send(bundle(1))
	roots := s.open(t, RootCertResourceName)
	r := roots.recv(t)
	if got := string(decode(t, r)[RootCertResourceName].GetValidationContext().GetTrustedCa().GetInlineBytes()); got != "roots-1" {
		t.Fatalf("ROOTCA trusted_ca %q", got)
	}
	roots.ack(t, r, RootCertResourceName)
	leaf := s.open(t, WorkloadKeyCertResourceName)
	leaf.recv(t)

	s.certs.Send(bundle(2))
	leaf.recv(t)
	roots.expectNothing(t, 200*time.Millisecond)

	b := bundle(3)
	b.RootsPEM = []byte("roots-2")
	s.certs.Send(b)
	r = roots.recv(t)
	if got := string(decode(t, r)[RootCertResourceName].GetValidationContext().GetTrustedCa().GetInlineBytes()); got != "roots-2" {
		t.Fatalf("new roots not pushed: %q", got)
	}
}

func TestManyStreamsEachGetPushes(t *testing.T) {
	s := startServer(t)
	s.certs.Send(bundle(1))
	var streams []*sotw
	for i := 0; i < 8; i++ {
		c := s.open(t, WorkloadKeyCertResourceName, RootCertResourceName)
		if r := c.recv(t); len(r.Resources) != 2 {
			t.Fatalf("stream %d: %d resources, want 2", i, len(r.Resources))
		}
		streams = append(streams, c)
	}
	s.certs.Send(bundle(2))
	for i, c := range streams {
		if r := c.recv(t); r.VersionInfo != "v2" {
			t.Fatalf("stream %d got %s", i, r.VersionInfo)
		}
	}
}

func TestNackIsLogged(t *testing.T) {
	s := startServer(t)
	s.certs.Send(bundle(1))
	c := s.open(t, WorkloadKeyCertResourceName)
	r := c.recv(t)
	c.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: SecretTypeURL, ResourceNames: []string{WorkloadKeyCertResourceName},
		ResponseNonce: r.Nonce, ErrorDetail: &statuspb.Status{Code: int32(codes.InvalidArgument), Message: "bad cert from test"}})
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(s.logs.String(), "bad cert from test") {
		if time.Now().After(deadline) {
			t.Fatalf("NACK not logged; log:\n%s", s.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.expectNothing(t, 100*time.Millisecond) // no resend of what was rejected
}

func TestUnknownResourceNameIsInvalidArgument(t *testing.T) {
	s := startServer(t)
	s.certs.Send(bundle(1))
	c := s.open(t, "file-cert:/x~/y")
	select {
	case err := <-c.errc:
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"file-cert:/x~/y"`) {
			t.Fatalf("error %v; want InvalidArgument naming the secret", err)
		}
	case r := <-c.resps:
		t.Fatalf("answered an unknown name: %v", r)
	case <-time.After(10 * time.Second):
		t.Fatal("no error for an unknown name")
	}
	_, err := s.client(t).FetchSecrets(context.Background(), &discoveryv3.DiscoveryRequest{ResourceNames: []string{"nope"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("fetch: %v", err)
	}
}

func TestFetchWaitsForFirstBundle(t *testing.T) {
	s := startServer(t)
	got := make(chan *discoveryv3.DiscoveryResponse, 1)
	errc := make(chan error, 1)
	go func() {
		r, err := s.client(t).FetchSecrets(context.Background(), &discoveryv3.DiscoveryRequest{ResourceNames: []string{RootCertResourceName}})
		if err != nil {
			errc <- err
			return
		}
		got <- r
	}()
	select {
	case <-got:
		t.Fatal("fetch answered before any bundle")
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(200 * time.Millisecond):
	}
	s.certs.Send(bundle(1))
	select {
	case r := <-got:
		if r.VersionInfo != "v1" || len(r.Resources) != 1 {
			t.Fatalf("fetch: %v", r)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("fetch never answered")
	}
}

func TestDeltaSendsOnlyChanges(t *testing.T) {
	s := startServer(t)
	s.certs.Send(bundle(1))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := s.client(t).DeltaSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: SecretTypeURL,
		ResourceNamesSubscribe: []string{WorkloadKeyCertResourceName, RootCertResourceName}}); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil || len(r.Resources) != 2 {
		t.Fatalf("first delta: %v %v", r, err)
	}
	stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: SecretTypeURL, ResponseNonce: r.Nonce})
	s.certs.Send(bundle(2)) // same roots
	r, err = stream.Recv()
	if err != nil || len(r.Resources) != 1 || r.Resources[0].Name != WorkloadKeyCertResourceName || r.Resources[0].Version != "v2" {
		t.Fatalf("delta push: %v %v", r, err)
	}
	cancel()
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
}

// The socket is owner-only in a 0750 directory, and no TCP listener exists.
func TestSocketPermissionsAndNoTCP(t *testing.T) {
	before := tcpListenInodes(t)
	s := startServer(t)
	fi, err := os.Stat(s.cfg.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want socket 0600", fi.Mode())
	}
	di, _ := os.Stat(filepath.Dir(s.cfg.SocketPath))
	if di.Mode().Perm() != 0o750 {
		t.Fatalf("socket dir mode %v, want 0750", di.Mode().Perm())
	}
	for ino := range tcpListenInodes(t) {
		if !before[ino] && ownSocket(t, ino) {
			t.Fatalf("the SDS server opened a TCP listener (socket inode %s)", ino)
		}
	}
}

// tcpListenInodes returns the inodes of listening TCP sockets in this
// network namespace.
func tcpListenInodes(t *testing.T) map[string]bool {
	out := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Skipf("cannot read %s: %v", f, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) > 9 && fields[3] == "0A" { // LISTEN
				out[fields[9]] = true
			}
		}
	}
	return out
}

func ownSocket(t *testing.T, inode string) bool {
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && l == "socket:["+inode+"]" {
			return true
		}
	}
	return false
}

func TestStaleSocketRemovedLiveSocketRefused(t *testing.T) {
	root, _ := os.MkdirTemp("", "sds")
	defer os.RemoveAll(root)
	cfg := NewConfig(filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket"))
	os.MkdirAll(filepath.Dir(cfg.SocketPath), 0o750)
	// A stale socket: bound, then its listener closed without unlinking.
	l, err := net.Listen("unix", cfg.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()

	health := messages.NewCell[messages.Health]()
	svc := newService(t, cfg, messages.NewCell[messages.CertBundle](), health, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx) }()
	for {
		h, ok, changed := health.Watch()
		if ok && h.State == messages.Ready {
			break
		}
		select {
		case <-changed:
		case err := <-done:
			t.Fatalf("did not replace a stale socket: %v", err)
		}
	}
	// A second server on the same path must refuse.
	err = newService(t, cfg, messages.NewCell[messages.CertBundle](), messages.NewCell[messages.Health](), nil).Serve(context.Background())
	if !errors.Is(err, ErrSocketInUse) || !strings.Contains(err.Error(), cfg.SocketPath) {
		t.Fatalf("second server: %v; want ErrSocketInUse naming the path", err)
	}
	cancel()
	<-done
	if _, err := os.Stat(cfg.SocketPath); !os.IsNotExist(err) {
		t.Fatalf("socket file left behind: %v", err)
	}
}

// At shutdown open streams end, and Serve can run again on the same object.
func TestShutdownEndsStreamsAndRestarts(t *testing.T) {
	s := startServer(t)
	s.certs.Send(bundle(1))
	c := s.open(t, WorkloadKeyCertResourceName)
	c.recv(t)
	s.stop(t)
	select {
	case err := <-c.errc:
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("stream ended with %v, want Unavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stream still open after shutdown")
	}
	if _, err := os.Stat(s.cfg.SocketPath); !os.IsNotExist(err) {
		t.Fatalf("socket file left behind: %v", err)
	}
	s.start(t)
	c2 := s.open(t, WorkloadKeyCertResourceName)
	if r := c2.recv(t); r.VersionInfo != "v1" {
		t.Fatalf("after restart: %s", r.VersionInfo)
	}
}

func TestConfigValidate(t *testing.T) {
	for field, c := range map[string]Config{
		"SocketPath":  {SocketPath: "relative/socket"},
		"StopTimeout": {SocketPath: "/x", StopTimeout: -1},
	} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
	}
	long := Config{SocketPath: "/" + strings.Repeat("a", 120)}
	if err := long.Validate(); err == nil || !strings.Contains(err.Error(), "107") {
		t.Errorf("long path: %v", err)
	}
}

// With a proxy UID/GID configured, the socket belongs to it and is 0660.
func TestSocketChownedToProxy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	root, _ := os.MkdirTemp("", "sds")
	defer os.RemoveAll(root)
	cfg := NewConfig(filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket"))
	cfg.SocketUID, cfg.SocketGID = 1337, 1337
	health := messages.NewCell[messages.Health]()
	svc := newService(t, cfg, messages.NewCell[messages.CertBundle](), health, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx) }()
	for {
		h, ok, changed := health.Watch()
		if ok && h.State == messages.Ready {
			break
		}
		select {
		case <-changed:
		case err := <-done:
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(cfg.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 1337 || st.Gid != 1337 || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket owner %d:%d mode %v; want 1337:1337 0660", st.Uid, st.Gid, fi.Mode().Perm())
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// newService is New with a test Runtime.
func newService(t testing.TB, cfg Config, certs messages.Latest[messages.CertBundle], health messages.Sink[messages.Health], log *slog.Logger) *Service {
	t.Helper()
	svc, err := New(cfg, certs, messages.NewRuntime(Name, health, nil, nil, log))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}
