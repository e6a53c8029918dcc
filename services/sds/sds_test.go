package sds

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestHeldUntilFirstBundleThenPushedOnSameStream(t *testing.T) {
	s := startServer(t)
	c := s.open(t, WorkloadKeyCertResourceName)
	c.expectNothing(t, 200*time.Millisecond)
	s.certs.Send(bundle(1))
	r := c.recv(t)
	sec := decode(t, r)[WorkloadKeyCertResourceName]
	if r.VersionInfo == "" || string(sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes()) != "chain-1" ||
		string(sec.GetTlsCertificate().GetPrivateKey().GetInlineBytes()) != "key-1" || r.TypeUrl != SecretTypeURL {
		t.Fatalf("first response: %v", r)
	}
	c.ack(t, r, WorkloadKeyCertResourceName)
	c.expectNothing(t, 100*time.Millisecond) // an ACK is not answered

	v1 := r.VersionInfo
	s.certs.Send(bundle(2))
	r = c.recv(t)
	if r.VersionInfo == v1 || string(decode(t, r)[WorkloadKeyCertResourceName].GetTlsCertificate().GetCertificateChain().GetInlineBytes()) != "chain-2" {
		t.Fatalf("push: %v", r)
	}
	c.ack(t, r, WorkloadKeyCertResourceName)
	// The same bundle again is not pushed, nor one with only new roots.
	s.certs.Send(bundle(2))
	b := bundle(2)
	b.RootsPEM, b.Version = []byte("roots-2"), "v2-new-roots"
	s.certs.Send(b)
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
		if got := chainOf(decode(t, c.recv(t))[WorkloadKeyCertResourceName]); got != "chain-2" {
			t.Fatalf("stream %d got chain %q", i, got)
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
	s.logs.WaitLine(t, "bad cert from test")
	c.expectNothing(t, 100*time.Millisecond) // no resend of what was rejected
}

// A name this server cannot serve is an InvalidArgument error for that name
// only, in the response's resource_errors: the other secrets on the stream
// are served, and pushed later, as usual. Istio would end the stream.
func TestBadNamesAreErrorsForThoseNamesOnly(t *testing.T) {
	s := startServer(t)
	s.certs.Send(bundle(1))
	bad := []string{"nope", "file-cert:/x", "file-cert:/x~/y~/z", "file-cert:~/y", "file-root:", "file-root:/a~/b"}
	names := append([]string{WorkloadKeyCertResourceName}, bad...)
	c := s.open(t, names...)
	got, errs := c.collect(t, "the good secret and the bad names' errors", names, func(s map[string]*tlsv3.Secret, errs map[string]*status.Status) bool {
		return len(s) == 1 && len(errs) == len(bad)
	})
	if chainOf(got[WorkloadKeyCertResourceName]) != "chain-1" {
		t.Fatal("good secret not served beside the bad names")
	}
	for _, n := range bad {
		st, ok := errs[n]
		if !ok || st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), `"`+n+`"`) {
			t.Errorf("%q: error %v; want InvalidArgument naming it", n, st)
		}
	}
	s.logs.WaitLine(t, "cannot serve secret", `name=nope`, "InvalidArgument")
	c.expectNothing(t, 100*time.Millisecond) // told once, not on every request

	s.certs.Send(bundle(2))
	if got := chainOf(decode(t, c.recv(t))[WorkloadKeyCertResourceName]); got != "chain-2" {
		t.Fatalf("stream with bad names no longer pushed: chain %q", got)
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
		if len(r.Resources) != 1 || trustedCA(decode(t, r)[RootCertResourceName]) != "roots-1" {
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
	stream := s.openDelta(t)
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
	if err != nil || len(r.Resources) != 1 || r.Resources[0].Name != WorkloadKeyCertResourceName || chainOf(decodeAny(t, r.Resources[0].Resource)) != "chain-2" {
		t.Fatalf("delta push: %v %v", r, err)
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
	case err := <-c.resps.Err():
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
	if got := chainOf(decode(t, c2.recv(t))[WorkloadKeyCertResourceName]); got != "chain-1" {
		t.Fatalf("after restart: chain %q", got)
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
