package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// The floor and the stand-in Envoy, built once by TestMain.
var floorBinary, envoyBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "floor")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	floorBinary, envoyBinary = filepath.Join(dir, "floor"), filepath.Join(dir, "fakeenvoy")
	for bin, pkg := range map[string]string{floorBinary: ".", envoyBinary: "../../../testdata/fakeenvoy"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", pkg, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// floorPod is a floor started as the bench starts it: in a pod root of
// its own with the mounted certificates, against a control plane.
type floorPod struct {
	root                     string
	status, admin, envoyPort int
	chain                    []byte
	out                      *strings.Builder
}

func startFloor(t *testing.T, proxyConfig func(p *floorPod) string) (*floorPod, *exec.Cmd) {
	t.Helper()
	p := &floorPod{root: t.TempDir(), out: &strings.Builder{}}
	ports, err := testkit.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	p.status, p.admin, p.envoyPort = ports[0], ports[1], ports[2]
	ca := pki.NewRoot(t, "floor-test")
	var key []byte
	p.chain, key = ca.Workload(t, time.Hour)
	testkit.WriteFile(t, filepath.Join(p.root, certsDir, "cert-chain.pem"), p.chain)
	testkit.WriteFile(t, filepath.Join(p.root, certsDir, "key.pem"), key)
	testkit.WriteFile(t, filepath.Join(p.root, certsDir, "root-cert.pem"), ca.CertPEM)
	cmd := exec.Command(floorBinary, "proxy", "sidecar")
	cmd.Dir = p.root
	cmd.Env = append(os.Environ(), "PROXY_CONFIG="+proxyConfig(p), fmt.Sprintf("ENVOY_STATUS_PORT=%d", p.envoyPort),
		"POD_NAME=floor-0", "POD_NAMESPACE=ns0", "INSTANCE_IP=127.0.0.1")
	cmd.Stdout, cmd.Stderr = p.out, p.out
	return p, cmd
}

// get is testkit.Fetch of path on the loopback port.
func get(port int, path string) (int, string) {
	return testkit.Fetch(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
}

// encoding is the Content-Encoding of path on the status port asked for
// gzip, as Prometheus asks.
func (p *floorPod) encoding(t *testing.T, path string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", p.status, path), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Header.Get("Content-Encoding")
}

// TestFloorDoesTheIdleJob: the floor is a floor only if it does the job
// the bench's idle window asks of an agent, for real: Envoy configured
// through its ADS proxy, the probe answered, the merged scrape, the
// certificate over SDS.
func TestFloorDoesTheIdleJob(t *testing.T) {
	cp, err := xdsserver.StartSmallMesh(xdsserver.Options{}, "ns0", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	p, cmd := startFloor(t, func(p *floorPod) string {
		return fmt.Sprintf(`{"discoveryAddress":%q,"statusPort":%d,"proxyAdminPort":%d,"binaryPath":%q}`, cp.Addr(), p.status, p.admin, envoyBinary)
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("floor's output:\n%s", p.out)
		}
	})

	// Ready only once Envoy is: its configuration came through the
	// floor's ADS proxy (the stand-in waits for CDS and LDS, Istio's
	// initial_fetch_timeout 0s).
	testkit.WaitFor(t, "the floor ready", func() bool { code, _ := get(p.status, "/healthz/ready"); return code == http.StatusOK })
	if _, clusters := get(p.admin, "/clusters"); !strings.Contains(clusters, "outbound|9080||reviews.ns0.svc.cluster.local") {
		t.Errorf("envoy's clusters lack the control plane's:\n%s", clusters)
	}
	if code, body := get(p.envoyPort, "/healthz/ready"); code != http.StatusOK || body != "ready\n" {
		t.Errorf("envoy's readiness listener: %d %q", code, body)
	}
	_, scrape := get(p.status, "/stats/prometheus") // Go's client asks for gzip and unpacks it
	if enc := p.encoding(t, "/stats/prometheus"); enc != "gzip" {
		t.Errorf("the scrape asked for gzip came %q", enc)
	}
	for _, want := range []string{"istio_agent_go_goroutines ", "istio_agent_process_resident_memory_bytes ", "envoy_server_live"} {
		if !strings.Contains(scrape, want) {
			t.Errorf("the scrape lacks %q", want)
		}
	}

	// The workload certificate over SDS, as Envoy would ask for it.
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.root, sdsSocket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
		ResourceNames: []string{"default"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var secret tlsv3.Secret
	if len(resp.Resources) != 1 || resp.Resources[0].UnmarshalTo(&secret) != nil {
		t.Fatalf("SDS answered %d resources, not the certificate", len(resp.Resources))
	}
	if got := string(secret.GetTlsCertificate().GetCertificateChain().GetInlineBytes()); got != string(p.chain) {
		t.Errorf("SDS's certificate is not the mounted one:\n%s", got)
	}
	// Envoy's ACK is not a question: the next answer is the root asked
	// after it, not the certificate again.
	for _, req := range []*discoveryv3.DiscoveryRequest{
		{TypeUrl: resp.TypeUrl, ResourceNames: []string{"default"}, ResponseNonce: resp.Nonce, VersionInfo: resp.VersionInfo},
		{TypeUrl: resp.TypeUrl, ResourceNames: []string{"ROOTCA"}, ResponseNonce: resp.Nonce, VersionInfo: resp.VersionInfo},
	} {
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err = stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if len(resp.Resources) != 1 || resp.Resources[0].UnmarshalTo(&secret) != nil || secret.Name != "ROOTCA" {
		t.Fatalf("after the ACK SDS answered %d resources, the first %q, not the root", len(resp.Resources), secret.Name)
	}
}

// TestFloorRefusesAMissingSetting: a bench misconfigured fails loudly,
// naming what is missing, rather than measuring an agent that never ran.
func TestFloorRefusesAMissingSetting(t *testing.T) {
	p, cmd := startFloor(t, func(p *floorPod) string { return fmt.Sprintf(`{"statusPort":%d}`, p.status) })
	if err := cmd.Run(); err == nil {
		t.Fatal("the floor ran without a control plane or an Envoy")
	}
	if !strings.Contains(p.out.String(), "PROXY_CONFIG: discoveryAddress") {
		t.Errorf("the error does not name the setting:\n%s", p.out)
	}
}
