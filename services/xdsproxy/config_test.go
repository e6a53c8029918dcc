package xdsproxy

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/uds"
	"github.com/meshagent/meshagent/services/xdsproxy/grpcbootstrap"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// Validate rejects each bad value, naming the field (and Istio's setting).
func TestValidateNamesTheField(t *testing.T) {
	good := testConfig("/tmp/root", "127.0.0.1:15010")
	if err := good.Validate(); err != nil {
		t.Fatalf("a good config: %v", err)
	}
	cases := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"relative socket", func(c *Config) { c.SocketPath = "etc/istio/proxy/XDS" }, "SocketPath"},
		{"long socket", func(c *Config) { c.SocketPath = "/" + strings.Repeat("x", 120) }, "at most 107"},
		{"no port", func(c *Config) { c.DiscoveryAddress = "istiod.istio-system.svc" }, "DiscoveryAddress (ProxyConfig.discoveryAddress)"},
		{"negative keepalive", func(c *Config) { c.KeepaliveInterval = -time.Second }, "GRPC_KEEPALIVE_INTERVAL"},
		{"negative stall", func(c *Config) { c.StallTimeout = -1 }, "StallTimeout"},
		{"backoff", func(c *Config) { c.ReconnectBackoff, c.ReconnectBackoffMax = time.Minute, time.Second }, "ReconnectBackoffMax"},
		{"no root file", func(c *Config) { c.Plaintext, c.RootCAFile = false, "" }, "RootCAFile (XDS_ROOT_CA)"},
		{"bad root source", func(c *Config) { c.Plaintext, c.Roots = false, ControlPlaneRootsSource(9) }, "Roots 9"},
		{"bad header", func(c *Config) { c.Headers = map[string]string{"a b": "c"} }, "XDS_HEADER_"},
		{"grpc header", func(c *Config) { c.Headers = map[string]string{"grpc-timeout": "1"} }, "XDS_HEADER_"},
		{"negative cache", func(c *Config) { c.CacheMaxBytes = -1 }, "CacheMaxBytes"},
		{"cache without node", func(c *Config) { c.NodeID = "" }, "NodeID"},
		{"relative cache", func(c *Config) { c.CacheFile = "xds-cache.pb" }, "CacheFile"},
		{"relative bootstrap", func(c *Config) {
			c.GRPCBootstrap = grpcbootstrap.Config{Path: "grpc-bootstrap.json", Node: &corev3.Node{Id: "x"}}
		}, "GRPC_XDS_BOOTSTRAP"},
		{"bootstrap without node", func(c *Config) { c.GRPCBootstrap = grpcbootstrap.Config{Path: "/tmp/b.json"} }, "Node has no id"},
		{"two client certificates", func(c *Config) { c.ClientCertificate, c.ProvCertDir = true, "/etc/certs" }, "PROV_CERT"},
		{"half the cert files", func(c *Config) {
			c.GRPCBootstrap = grpcbootstrap.Config{Path: "/tmp/b.json", Node: &corev3.Node{Id: "x"}, CertFile: "/c.pem"}
		}, "all set or all empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.change(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrBadConfig) {
				t.Errorf("%v is not ErrBadConfig", err)
			}
			testkit.Contains(t, "error", err.Error(), tc.want)
			if _, err := New(c, Inputs{}, Outputs{}, messages.Runtime{}); err == nil {
				t.Error("New accepted it")
			}
		})
	}
	// Certificates needed but no input for them.
	c := good
	c.Plaintext, c.Roots = false, RootsCertBundle
	if _, err := New(c, Inputs{}, Outputs{}, messages.Runtime{}); err == nil || !strings.Contains(err.Error(), "Inputs.Certs") {
		t.Errorf("New without Inputs.Certs: %v", err)
	}
}

// Istio's server name rule.
func TestServerName(t *testing.T) {
	for addr, want := range map[string]string{
		"istiod.istio-system.svc:15012": "istiod.istio-system.svc",
		"localhost:15012":               "istiod.istio-system.svc",
		"10.0.0.1:15012":                "10.0.0.1",
	} {
		if got := (Config{DiscoveryAddress: addr}).serverName(); got != want {
			t.Errorf("%s: server name %q, want %q", addr, got, want)
		}
	}
	if got := (Config{DiscoveryAddress: "localhost:15012", ServerName: "istiod.custom"}).serverName(); got != "istiod.custom" {
		t.Errorf("ISTIOD_SAN not honoured: %q", got)
	}
}

// The socket: owner-only, a stale one is replaced, a live one refused with
// an error naming the path, and it is gone after Serve.
func TestSocket(t *testing.T) {
	cfg := testConfig(tempRoot(t), "127.0.0.1:1")
	// A stale socket: bound, then its listener closed without unlinking.
	if err := os.MkdirAll(filepath.Dir(cfg.SocketPath), 0o750); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", cfg.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()

	p := startProxy(t, cfg, proxyOpts{})
	fi, err := os.Stat(cfg.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want a 0600 socket", fi.Mode())
	}
	testkit.Contains(t, "logs", p.logs.String(), "removing stale XDS socket")

	// A second proxy on the same path is refused.
	second, err := New(cfg, Inputs{}, Outputs{}, messages.Runtime{})
	if err != nil {
		t.Fatal(err)
	}
	err = second.Serve(context.Background())
	if !errors.Is(err, ErrSocketInUse) || !strings.Contains(err.Error(), cfg.SocketPath) {
		t.Errorf("second Serve: %v, want ErrSocketInUse naming %s", err, cfg.SocketPath)
	}
	p.stop(t)
	if _, err := os.Stat(cfg.SocketPath); !os.IsNotExist(err) {
		t.Errorf("socket left behind after Serve: %v", err)
	}

	// With a group: 0660 and chowned (as root; otherwise only our own gid).
	cfg.SocketOwner = uds.Owner{UID: os.Getuid(), GID: os.Getgid()}
	p = startProxy(t, cfg, proxyOpts{})
	fi, err = os.Stat(cfg.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode with a group %v, want 0660", fi.Mode().Perm())
	}
	p.stop(t)
}

// A path that is not a socket is not removed.
func TestSocketPathNotASocket(t *testing.T) {
	cfg := testConfig(tempRoot(t), "127.0.0.1:1")
	testkit.WriteFile(t, cfg.SocketPath, []byte("precious"))
	s, err := New(cfg, Inputs{}, Outputs{}, messages.Runtime{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(context.Background()); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Errorf("Serve: %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(cfg.SocketPath); string(b) != "precious" {
		t.Error("the file was replaced")
	}
}

// A keepalive of 0 reaches gRPC as 0, its own meaning, as in Istio's agent
// (#34: it became 30s here, so GRPC_KEEPALIVE_INTERVAL=0s was not Istio's);
// a negative one is refused, naming the variable.
func TestKeepaliveZeroIsGRPCs(t *testing.T) {
	c := Config{}.withDefaults()
	if c.KeepaliveInterval != 0 || c.KeepaliveTimeout != 0 {
		t.Errorf("keepalive 0/0 became %v/%v", c.KeepaliveInterval, c.KeepaliveTimeout)
	}
}
