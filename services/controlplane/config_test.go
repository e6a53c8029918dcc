package controlplane

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

func TestConfigValidate(t *testing.T) {
	good := NewConfig("127.0.0.1:0", "/etc/mesh.yaml")
	testkit.EachEditRejected(t, good, map[string]func(*Config){
		"non-loopback listen": func(c *Config) { c.Listen = "0.0.0.0:16010" },
		"no listen":           func(c *Config) { c.Listen = "" },
		"listen without port": func(c *Config) { c.Listen = "127.0.0.1" },
		"no mesh file":        func(c *Config) { c.MeshFile = "" },
		"cert without key":    func(c *Config) { c.TLS.CertFile = "/c.pem" },
		"client CA alone":     func(c *Config) { c.TLS.ClientCAFile = "/ca.pem" },
		"no debounce":         func(c *Config) { c.Debounce = 0 },
	})
	for _, ok := range []string{"localhost:0", "[::1]:16010", "127.0.0.2:1"} {
		c := good
		c.Listen = ok
		if err := c.Validate(); err != nil {
			t.Errorf("Listen %s: %v", ok, err)
		}
	}
}

// With TLS files the server speaks TLS only.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	root := pki.NewRoot(t, "controlplane test root")
	chain, key := root.Leaf(t, pki.Leaf{IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	testkit.WriteFile(t, certFile, chain)
	testkit.WriteFile(t, keyFile, key)
	pool := root.Pool()
	s := startServer(t, readSample(t), messages.Ready, func(c *Config) {
		c.TLS = TLSFiles{CertFile: certFile, KeyFile: keyFile}
	})
	conn, err := grpc.NewClient(s.svc.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := openSotW(t, conn)
	if r := c.fetch(t, resource.ClusterType, nil); len(r.GetResources()) != 6 {
		t.Fatalf("CDS over TLS: %d clusters", len(r.GetResources()))
	}

	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(s.dial(t)).StreamAggregatedResources(ctx) // plaintext
	if err == nil {
		if err = stream.Send(&discovery.DiscoveryRequest{Node: sidecarNode, TypeUrl: resource.ClusterType}); err == nil {
			_, err = stream.Recv()
		}
	}
	if err == nil {
		t.Fatal("a plaintext client got an answer from the TLS server")
	}
}
