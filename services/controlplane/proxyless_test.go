package controlplane

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and its balancers

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// The environment of the child process that plays the proxyless client.
const (
	childTargetEnv = "CONTROLPLANE_TEST_XDS_TARGET"
	childFirstEnv  = "CONTROLPLANE_TEST_FIRST_ENDPOINT"
	childSecondEnv = "CONTROLPLANE_TEST_SECOND_ENDPOINT"
)

// grpc-go's own xDS client, pointed at the control plane by a bootstrap
// file as Istio's agent writes one for proxyless gRPC, resolves
// xds:///<fqdn>:<port> through the API listener, its route, the cluster
// and its endpoints, and completes an RPC on the endpoint; an edit of the
// file moves its RPCs to the new endpoint.
//
// grpc-go reads GRPC_XDS_BOOTSTRAP once, when its package is initialised,
// so the client runs in a child process (this test binary, running
// TestProxylessChild) started with the variable set.
func TestProxylessGRPCClientResolvesThroughTheControlPlane(t *testing.T) {
	first, second := xdsserver.HealthBackend(t), xdsserver.HealthBackend(t)
	meshFor := func(endpoint string) []byte {
		return []byte(fmt.Sprintf(`
services:
  - name: ratings
    namespace: default
    vip: 10.96.0.11
    ports: [{port: 7070, protocol: grpc, endpoints: ["%s"]}]
`, endpoint))
	}
	s := startServer(t, meshFor(first), messages.Ready, nil)

	bootstrap, err := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      s.svc.Addr(),
			"channel_creds":   []any{map[string]any{"type": "insecure"}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{
			"id":       "sidecar~127.0.0.1~proxyless-0.default~default.svc.cluster.local",
			"metadata": map[string]any{"GENERATOR": "grpc"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	bootstrapFile := filepath.Join(t.TempDir(), "grpc-bootstrap.json")
	if err := os.WriteFile(bootstrapFile, bootstrap, 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*testkit.Timeout)
	defer cancel()
	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestProxylessChild$", "-test.count=1", "-test.v")
	child.Env = append(os.Environ(),
		"GRPC_XDS_BOOTSTRAP="+bootstrapFile,
		childTargetEnv+"=xds:///ratings.default.svc.cluster.local:7070",
		childFirstEnv+"="+first,
		childSecondEnv+"="+second)
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	child.Stderr = &stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var output strings.Builder
	lines := bufio.NewScanner(io.TeeReader(stdout, &output))
	edited := false
	for lines.Scan() {
		if !edited && strings.HasPrefix(lines.Text(), "REACHED "+first) {
			s.writeMesh(t, meshFor(second))
			edited = true
		}
	}
	err = child.Wait()
	if err != nil || !edited || !strings.Contains(output.String(), "REACHED "+second) {
		t.Fatalf("proxyless client: %v (edited: %v)\nstdout:\n%s\nstderr:\n%s\ncontrol plane logs:\n%s", err, edited, &output, &stderr, s.logs)
	}
}

// TestProxylessChild is the client half of the test above; it runs only in
// the child process.
func TestProxylessChild(t *testing.T) {
	target := os.Getenv(childTargetEnv)
	if target == "" {
		t.Skip("runs only as the child of TestProxylessGRPCClientResolvesThroughTheControlPlane")
	}
	client := healthpb.NewHealthClient(testkit.DialPlain(t, target))
	for _, want := range []string{os.Getenv(childFirstEnv), os.Getenv(childSecondEnv)} {
		deadline := time.Now().Add(testkit.Timeout)
		for {
			var p peer.Peer
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p), grpc.WaitForReady(true))
			cancel()
			if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING && p.Addr != nil && p.Addr.String() == want {
				fmt.Printf("REACHED %s\n", want)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("never reached %s; last: peer %v, err %v", want, p.Addr, err)
			}
		}
	}
}
