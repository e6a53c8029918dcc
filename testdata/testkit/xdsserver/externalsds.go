package xdsserver

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	sdsv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
)

// ExternalSDS is another SDS server (SPIRE's agent, say) listening on the
// unix socket path until the end of the test: a live socket that the
// agent's SDS server must leave alone. It answers no secret.
func ExternalSDS(t testing.TB, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	sdsv3.RegisterSecretDiscoveryServiceServer(srv, sdsv3.UnimplementedSecretDiscoveryServiceServer{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
}
