package e2ekit

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	sdsv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
	"github.com/miekg/dns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Eventually is how long the tests wait for something the agent does on
// its own: a liveness bound, not a timing assertion.
const Eventually = 30 * time.Second

// StartStandalone runs `meshagent standalone --mesh mesh` with every port
// free and chosen here, and the DNS proxy forwarding to upstream (an IP on
// port 53; "" forwards to a loopback address where nothing answers).
func StartStandalone(t *testing.T, mesh, upstream string, args ...string) *StandaloneProcess {
	t.Helper()
	root := testkit.ShortTempDir(t, "ma")
	if upstream == "" {
		upstream = "127.0.0.1"
		t.Log("no resolver of the test's own: names outside the mesh are not checked")
	}
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	testkit.WriteFile(t, resolv, []byte("nameserver "+upstream+"\nsearch default.svc.cluster.local svc.cluster.local cluster.local\n"))
	ports := FreePorts(t, 7)
	status, admin, envoyStatus, prom, dnsPort, cp, ca := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5], ports[6]
	cmd := exec.Command(AgentBinary, append([]string{"standalone", "--root", root, "--mesh", mesh, "--chaos",
		"--resolv-conf", resolv,
		"--controlplane-listen", fmt.Sprintf("127.0.0.1:%d", cp), "--ca-listen", fmt.Sprintf("127.0.0.1:%d", ca)}, args...)...)
	// PROXY_CONFIG moves the ports and names the Envoy under test; the
	// wiring to the peers (discoveryAddress) stays standalone's.
	cmd.Env = append(os.Environ(),
		fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"binaryPath":%q,"terminationDrainDuration":"1s"}`, status, admin, EnvoyBinary),
		fmt.Sprintf("ENVOY_STATUS_PORT=%d", envoyStatus),
		fmt.Sprintf("ENVOY_PROMETHEUS_PORT=%d", prom),
		fmt.Sprintf("DNS_PROXY_ADDR=127.0.0.1:%d", dnsPort),
		"ECC_SIGNATURE_ALGORITHM=ECDSA", // RSA works too, but keys are slow under -race
	)
	p := &StandaloneProcess{DNSAddr: fmt.Sprintf("127.0.0.1:%d", dnsPort), AgentProcess: &AgentProcess{
		Cmd: cmd, Base: fmt.Sprintf("http://127.0.0.1:%d", status), Stderr: &testkit.LogBuffer{}, Exited: make(chan error, 1),
		Root: root, AdminPort: admin, EnvoyStatusPort: envoyStatus, PromPort: prom}}
	p.Start(t)
	return p
}

// StandaloneProcess is a running `meshagent standalone`.
type StandaloneProcess struct {
	*AgentProcess
	DNSAddr string // the DNS proxy's
}

// WaitConfigDump waits until Envoy's /config_dump names every one of names.
func (p *StandaloneProcess) WaitConfigDump(t *testing.T, names ...string) {
	t.Helper()
	admin := fmt.Sprintf("http://127.0.0.1:%d/config_dump", p.AdminPort)
	WaitUntil(t, fmt.Sprintf("%v in Envoy's /config_dump", names), func() bool {
		code, body := HTTPGet(admin)
		return code == 200 && !slices.ContainsFunc(names, func(n string) bool { return !strings.Contains(body, n) })
	})
}

// WaitDNS waits until the DNS proxy answers name's A query with want.
func (p *StandaloneProcess) WaitDNS(t *testing.T, name, want string) {
	t.Helper()
	var last string
	WaitUntil(t, fmt.Sprintf("DNS %s = %s", name, want), func() bool {
		c := &dns.Client{Timeout: 2 * time.Second}
		r, _, err := c.Exchange(new(dns.Msg).SetQuestion(dns.Fqdn(name), dns.TypeA), p.DNSAddr)
		if err != nil {
			last = err.Error()
			return false
		}
		last = fmt.Sprint(r.Answer)
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok && a.A.String() == want {
				return true
			}
		}
		return false
	}, func() string { return "last answer " + last })
}

// TreeLine is the line of /debug/tree holding node.
func (p *StandaloneProcess) TreeLine(t *testing.T, node string) string {
	t.Helper()
	_, body := p.Get("/debug/tree")
	for _, line := range strings.Split(body, "\n") {
		if strings.Contains(line, node) {
			return line
		}
	}
	return ""
}

func (p *StandaloneProcess) WaitTreeLine(t *testing.T, node, want string) {
	t.Helper()
	WaitUntil(t, fmt.Sprintf("%q in the %s line of /debug/tree", want, node), func() bool {
		return strings.Contains(p.TreeLine(t, node), want)
	}, func() string { return p.TreeLine(t, node) })
}

// WaitUntil polls cond until it holds, failing the test after eventually;
// detail, if given, says what was last seen.
func WaitUntil(t *testing.T, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(Eventually)
	for !cond() {
		if time.Now().After(deadline) {
			seen := ""
			for _, d := range detail {
				seen += ": " + d()
			}
			t.Fatalf("timed out waiting for %s%s", what, seen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func HTTPGet(url string) (int, string) {
	resp, err := HTTPClient().Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// WatchSDSCertificates asks the agent's SDS server for "default" as Envoy
// does, and sends the leaf of every new certificate it pushes. Like Envoy,
// it reconnects when the stream ends (the SDS server restarted).
func WatchSDSCertificates(t *testing.T, socket string) <-chan *x509.Certificate {
	t.Helper()
	WaitUntil(t, "the SDS socket", func() bool { _, err := os.Stat(socket); return err == nil })
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan *x509.Certificate, 16)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var last []byte // the leaf last sent, not sent again after a reconnect
		for ctx.Err() == nil {
			last = StreamSDSCertificates(ctx, conn, out, last)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait(); conn.Close() })
	return out
}

// StreamSDSCertificates is one SDS stream of watchSDSCertificates, until it
// ends; it returns the leaf it last sent.
func StreamSDSCertificates(ctx context.Context, conn *grpc.ClientConn, out chan<- *x509.Certificate, last []byte) []byte {
	stream, err := sdsv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	if err != nil {
		return last
	}
	req := &discoveryv3.DiscoveryRequest{TypeUrl: resource.SecretType, ResourceNames: []string{"default"}}
	for stream.Send(req) == nil {
		resp, err := stream.Recv()
		if err != nil {
			return last
		}
		for _, r := range resp.GetResources() {
			secret := &tlsv3.Secret{}
			if r.UnmarshalTo(secret) != nil || secret.GetName() != "default" {
				continue
			}
			block, _ := pem.Decode(secret.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
			if block == nil || bytes.Equal(block.Bytes, last) {
				continue
			}
			leaf, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				continue
			}
			select {
			case out <- leaf:
				last = block.Bytes
			case <-ctx.Done():
				return last
			}
		}
		// ACK, as Envoy does, and wait for the next push.
		req = &discoveryv3.DiscoveryRequest{TypeUrl: resource.SecretType, ResourceNames: []string{"default"},
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
	}
	return last
}

// NextCertificate is the next certificate pushed over SDS.
func NextCertificate(t *testing.T, certs <-chan *x509.Certificate, what string) *x509.Certificate {
	t.Helper()
	select {
	case c := <-certs:
		return c
	case <-time.After(Eventually):
		t.Fatalf("no %s over SDS", what)
		return nil
	}
}

func ReadCertificate(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	WaitUntil(t, path, func() bool { _, err := os.Stat(path); return err == nil })
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return pki.ParseLeaf(t, b)
}

// StartUpstreamResolver is the test kit's dnsmasq, answering
// *.upstream.test with 192.0.2.77. It returns its address, or "" when it
// cannot run here (no dnsmasq, or not root: port 53).
func StartUpstreamResolver(t *testing.T) string {
	t.Helper()
	ip, why := testkit.Dnsmasq(t)
	if ip == "" {
		t.Log(why)
	}
	return ip
}
