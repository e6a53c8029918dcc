package xdsproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	// grpc-go's own xDS client: the xds:/// resolver and its balancers.
	_ "google.golang.org/grpc/xds"

	"github.com/meshagent/meshagent/services/xdsproxy/grpcbootstrap"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// grpcClientEnv, set to an xds:/// target, makes this test binary a
// proxyless gRPC client (see TestMain): grpc-go's xDS client reads
// GRPC_XDS_BOOTSTRAP and keeps process-wide state, so it runs in a process
// of its own.
const grpcClientEnv = "XDSPROXY_TEST_GRPC_CLIENT"

// runGRPCClient checks the health of the target three times and prints
// each answer.
func runGRPCClient() int {
	target := os.Getenv(grpcClientEnv)
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpc client:", err)
		return 1
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 3 {
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			fmt.Fprintln(os.Stderr, "grpc client: Check:", err)
			return 1
		}
		fmt.Println("health:", resp.GetStatus())
	}
	return 0
}

// A proxyless gRPC application with the bootstrap the proxy writes
// resolves xds:///<service> through the proxy (LDS → RDS → CDS → EDS, as
// grpc-go's xDS client asks) and reaches its backend.
func TestProxylessGRPCThroughProxy(t *testing.T) {
	const target = "echo.default.svc.cluster.local"
	svc := xdsserver.NewGRPCService(target, netip.MustParseAddrPort(xdsserver.HealthBackend(t)))
	cp := controlPlane(t, xdsserver.Options{})
	if err := cp.SetSnapshot("v1", []types.Resource{svc.Cluster}, []types.Resource{svc.Listener},
		[]types.Resource{svc.Route}, []types.Resource{svc.Endpoint}, nil); err != nil {
		t.Fatal(err)
	}
	root := tempRoot(t)
	cfg := testConfig(root, cp.Addr())
	certDir := filepath.Join(root, "etc/certs")
	meta, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "default", "INSTANCE_IPS": "127.0.0.1"})
	cfg.GRPCBootstrap = grpcbootstrap.Config{
		Path:     filepath.Join(root, "etc/istio/proxy/grpc-bootstrap.json"),
		Node:     &corev3.Node{Id: "sidecar~127.0.0.1~grpc-app.default~default.svc.cluster.local", Metadata: meta},
		CertFile: filepath.Join(certDir, "cert-chain.pem"), KeyFile: filepath.Join(certDir, "key.pem"),
		CAFile: filepath.Join(certDir, "root-cert.pem"),
	}
	startProxy(t, cfg, proxyOpts{})
	checkBootstrap(t, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), grpcClientEnv+"=xds:///"+target, "GRPC_XDS_BOOTSTRAP="+cfg.GRPCBootstrap.Path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the gRPC client failed: %v\n%s", err, out)
	}
	t.Logf("gRPC client:\n%s", out)
	if n := strings.Count(string(out), "health: SERVING"); n != 3 {
		t.Errorf("the gRPC client got %d SERVING answers, want 3:\n%s", n, out)
	}
	st := cp.Stats()
	for _, typ := range []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType} {
		if st.ACKs[typ] < 1 {
			t.Errorf("grpc-go did not ACK %s through the proxy (stats %+v)", typ, st.ACKs)
		}
	}
	if got := st.Metadata.Get("user-agent"); len(got) == 0 {
		t.Error("no user agent on the upstream stream")
	}
}

// checkBootstrap reads the bootstrap as JSON and checks Istio's fields.
func checkBootstrap(t *testing.T, cfg Config) {
	t.Helper()
	b, err := os.ReadFile(cfg.GRPCBootstrap.Path)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		XDSServers []struct {
			ServerURI    string `json:"server_uri"`
			ChannelCreds []struct {
				Type string `json:"type"`
			} `json:"channel_creds"`
			ServerFeatures []string `json:"server_features"`
		} `json:"xds_servers"`
		Node struct {
			ID       string         `json:"id"`
			Metadata map[string]any `json:"metadata"`
		} `json:"node"`
		CertProviders map[string]struct {
			PluginName string            `json:"plugin_name"`
			Config     map[string]string `json:"config"`
		} `json:"certificate_providers"`
		Template string `json:"server_listener_resource_name_template"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("bootstrap is not JSON: %v\n%s", err, b)
	}
	if len(got.XDSServers) != 1 || got.XDSServers[0].ServerURI != "unix://"+cfg.SocketPath ||
		len(got.XDSServers[0].ChannelCreds) != 1 || got.XDSServers[0].ChannelCreds[0].Type != "insecure" ||
		strings.Join(got.XDSServers[0].ServerFeatures, ",") != "xds_v3" {
		t.Errorf("xds_servers = %+v", got.XDSServers)
	}
	if got.Node.ID != cfg.GRPCBootstrap.Node.GetId() || got.Node.Metadata["GENERATOR"] != "grpc" || got.Node.Metadata["NAMESPACE"] != "default" {
		t.Errorf("node = %+v", got.Node)
	}
	p := got.CertProviders["default"]
	if p.PluginName != "file_watcher" || p.Config["certificate_file"] != cfg.GRPCBootstrap.CertFile ||
		p.Config["private_key_file"] != cfg.GRPCBootstrap.KeyFile || p.Config["ca_certificate_file"] != cfg.GRPCBootstrap.CAFile ||
		p.Config["refresh_interval"] != "900s" {
		t.Errorf("certificate_providers.default = %+v", p)
	}
	if got.Template != "xds.istio.io/grpc/lds/inbound/%s" {
		t.Errorf("server_listener_resource_name_template = %q", got.Template)
	}
}
