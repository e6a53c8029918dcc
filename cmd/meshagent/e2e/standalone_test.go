package main

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
	"syscall"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	sdsv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/miekg/dns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// `meshagent standalone` as a new user runs it: the real binary with the
// sample mesh, in a temp root, every port moved to a free one, and a
// resolver of the test's own as the DNS proxy's upstream.

// eventually is how long the tests wait for something the agent does on
// its own: a liveness bound, not a timing assertion.
const eventually = 30 * time.Second

// The whole mesh on one machine: the agent comes to ready on its own, the
// peers are in its tree, its certificate comes from the embedded CA over
// its real CA client and rotates, Envoy holds the sample's clusters, DNS
// answers the sample's names from NDS, an edit of the YAML reaches both, a
// bad edit keeps the last good mesh and says why, a killed control plane
// comes back, and Ctrl-C stops it all.
func TestStandaloneRunsTheSampleMesh(t *testing.T) {
	mesh := filepath.Join(t.TempDir(), "mesh.yaml")
	sample, err := os.ReadFile("../../testdata/standalone/mesh.yaml")
	if err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, mesh, []byte(string(sample)))
	upstream := startUpstreamResolver(t)
	p := startStandalone(t, mesh, upstream, "--cert-lifetime", "10s")

	p.waitStatus(t, "/healthz/ready", 200)
	tree := p.waitStatus(t, "/debug/tree", 200)
	for _, node := range []string{"── peers", "── controlplane", "── ca ", "── certs", "── xds", "── dns", "── envoy"} {
		if !strings.Contains(tree, node) {
			t.Errorf("/debug/tree lacks %q:\n%s", node, tree)
		}
	}

	// The certificate Envoy gets over SDS was signed by the embedded CA for
	// the agent's identity, and a new one is pushed before it expires.
	caRoot := readCertificate(t, filepath.Join(p.root, "var/lib/meshagent/ca/root-cert.pem"))
	certsOverSDS := watchSDSCertificates(t, filepath.Join(p.root, "var/run/secrets/workload-spiffe-uds/socket"))
	first := nextCertificate(t, certsOverSDS, "certificate")
	if err := first.CheckSignatureFrom(caRoot); err != nil {
		t.Errorf("the workload certificate is not the embedded CA's: %v", err)
	}
	if len(first.URIs) != 1 || first.URIs[0].String() != "spiffe://cluster.local/ns/default/sa/default" {
		t.Errorf("workload certificate for %v, want spiffe://cluster.local/ns/default/sa/default", first.URIs)
	}
	if lifetime := first.NotAfter.Sub(first.NotBefore); lifetime > 15*time.Second {
		t.Errorf("certificate lifetime %v, want --cert-lifetime 10s (plus a little backdating)", lifetime)
	}

	// What Envoy holds, and what DNS answers, come from the sample.
	reviews := "outbound|9080||reviews.default.svc.cluster.local"
	p.waitConfigDump(t, reviews, "outbound|7070||ratings.default.svc.cluster.local")
	for name, want := range map[string]string{
		"reviews.default.svc.cluster.local": "10.96.0.10",
		"reviews":                           "10.96.0.10", // Kubernetes short name, the pod being in default
		"ratings.default":                   "10.96.0.11",
		"api.example.com":                   "240.240.0.10",
	} {
		p.waitDNS(t, name, want)
	}
	if upstream != "" {
		p.waitDNS(t, "anything.upstream.test", "192.0.2.77") // not in the mesh: forwarded to --resolv-conf's resolver
	}

	// The control plane is a restartable service like any other; the
	// restarted one serves the next edit.
	if code, err := postTo(p.base + "/debug/chaos/kill?service=controlplane"); err != nil || code != 200 {
		t.Fatalf("chaos kill controlplane: %d %v", code, err)
	}
	p.waitLog(t, "the control plane's restart", func(log string) bool {
		return strings.Contains(log, `msg="service failed; restarting" service=controlplane`)
	})

	// Add a service: Envoy gets its cluster and DNS its name.
	details := "  - name: details\n    namespace: default\n    vip: 10.96.0.12\n    ports:\n" +
		"      - port: 9080\n        protocol: http\n        endpoints: [127.0.0.1:19083]\n\n"
	edited := strings.Replace(string(sample), "externalNames:", details+"externalNames:", 1)
	testkit.WriteFile(t, mesh, []byte(edited))
	p.waitConfigDump(t, "outbound|9080||details.default.svc.cluster.local")
	p.waitDNS(t, "details.default.svc.cluster.local", "10.96.0.12")

	// A bad edit is rejected whole: the last good mesh stays served, the
	// agent stays ready, and the control plane's line in /debug/tree says
	// why.
	bad := strings.Replace(edited, "vip: 10.96.0.12", "vip: 10.96.0.300", 1)
	testkit.WriteFile(t, mesh, []byte(bad))
	// The control plane names the line of the service that is wrong.
	badLine := fmt.Sprintf("line %d", 1+strings.Count(bad[:strings.Index(bad, "- name: details")], "\n"))
	p.waitTreeLine(t, "── controlplane", "rejected")
	if line := p.treeLine(t, "── controlplane"); !strings.Contains(line, "degraded") || !strings.Contains(line, badLine) {
		t.Errorf("controlplane in /debug/tree: %q, want degraded, naming %s", line, badLine)
	}
	p.waitDNS(t, "details.default.svc.cluster.local", "10.96.0.12")
	if _, dump := httpGet(fmt.Sprintf("http://127.0.0.1:%d/config_dump", p.adminPort)); !strings.Contains(dump, "outbound|9080||details.default.svc.cluster.local") {
		t.Error("after a bad mesh edit, Envoy lost the last good mesh's details cluster")
	}
	if code, body := p.get("/healthz/ready"); code != 200 {
		t.Errorf("after a bad mesh edit: ready = %d %s, want 200 (the last good mesh is served)", code, body)
	}

	// The first certificate lives 10s: its successor is pushed before it
	// expires, on the same stream.
	second := nextCertificate(t, certsOverSDS, "rotated certificate")
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 || !second.NotAfter.After(first.NotAfter) {
		t.Errorf("rotated certificate: serial %x until %v; the first: serial %x until %v",
			second.SerialNumber, second.NotAfter, first.SerialNumber, first.NotAfter)
	}
	if err := second.CheckSignatureFrom(caRoot); err != nil {
		t.Errorf("the rotated certificate is not the embedded CA's: %v", err)
	}

	// Ctrl-C drains Envoy and stops everything, peers included.
	if log := p.stopWith(t, syscall.SIGINT); !strings.Contains(log, "meshagent stopped") {
		t.Errorf("no clean stop in the log")
	}
}

// startStandalone runs `meshagent standalone --mesh mesh` with every port
// free and chosen here, and the DNS proxy forwarding to upstream (an IP on
// port 53; "" forwards to a loopback address where nothing answers).
func startStandalone(t *testing.T, mesh, upstream string, args ...string) *standaloneProcess {
	t.Helper()
	root := testkit.ShortTempDir(t, "ma")
	if upstream == "" {
		upstream = "127.0.0.1"
		t.Log("no resolver of the test's own: names outside the mesh are not checked")
	}
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	testkit.WriteFile(t, resolv, []byte("nameserver "+upstream+"\nsearch default.svc.cluster.local svc.cluster.local cluster.local\n"))
	ports := freePorts(t, 7)
	status, admin, envoyStatus, prom, dnsPort, cp, ca := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5], ports[6]
	cmd := exec.Command(agentBinary, append([]string{"standalone", "--root", root, "--mesh", mesh, "--chaos",
		"--resolv-conf", resolv,
		"--controlplane-listen", fmt.Sprintf("127.0.0.1:%d", cp), "--ca-listen", fmt.Sprintf("127.0.0.1:%d", ca)}, args...)...)
	// PROXY_CONFIG moves the ports and names the Envoy under test; the
	// wiring to the peers (discoveryAddress) stays standalone's.
	cmd.Env = append(os.Environ(),
		fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"binaryPath":%q,"terminationDrainDuration":"1s"}`, status, admin, envoyBinary),
		fmt.Sprintf("ENVOY_STATUS_PORT=%d", envoyStatus),
		fmt.Sprintf("ENVOY_PROMETHEUS_PORT=%d", prom),
		fmt.Sprintf("DNS_PROXY_ADDR=127.0.0.1:%d", dnsPort),
		"ECC_SIGNATURE_ALGORITHM=ECDSA", // RSA works too, but keys are slow under -race
	)
	p := &standaloneProcess{dnsAddr: fmt.Sprintf("127.0.0.1:%d", dnsPort), agentProcess: &agentProcess{
		cmd: cmd, base: fmt.Sprintf("http://127.0.0.1:%d", status), stderr: &testkit.LogBuffer{}, exited: make(chan error, 1),
		root: root, adminPort: admin, envoyStatusPort: envoyStatus, promPort: prom}}
	p.start(t)
	return p
}

// standaloneProcess is a running `meshagent standalone`.
type standaloneProcess struct {
	*agentProcess
	dnsAddr string // the DNS proxy's
}

// waitConfigDump waits until Envoy's /config_dump names every one of names.
func (p *standaloneProcess) waitConfigDump(t *testing.T, names ...string) {
	t.Helper()
	admin := fmt.Sprintf("http://127.0.0.1:%d/config_dump", p.adminPort)
	waitUntil(t, fmt.Sprintf("%v in Envoy's /config_dump", names), func() bool {
		code, body := httpGet(admin)
		return code == 200 && !slices.ContainsFunc(names, func(n string) bool { return !strings.Contains(body, n) })
	})
}

// waitDNS waits until the DNS proxy answers name's A query with want.
func (p *standaloneProcess) waitDNS(t *testing.T, name, want string) {
	t.Helper()
	var last string
	waitUntil(t, fmt.Sprintf("DNS %s = %s", name, want), func() bool {
		c := &dns.Client{Timeout: 2 * time.Second}
		r, _, err := c.Exchange(new(dns.Msg).SetQuestion(dns.Fqdn(name), dns.TypeA), p.dnsAddr)
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

// treeLine is the line of /debug/tree holding node.
func (p *standaloneProcess) treeLine(t *testing.T, node string) string {
	t.Helper()
	_, body := p.get("/debug/tree")
	for _, line := range strings.Split(body, "\n") {
		if strings.Contains(line, node) {
			return line
		}
	}
	return ""
}

func (p *standaloneProcess) waitTreeLine(t *testing.T, node, want string) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%q in the %s line of /debug/tree", want, node), func() bool {
		return strings.Contains(p.treeLine(t, node), want)
	}, func() string { return p.treeLine(t, node) })
}

// waitUntil polls cond until it holds, failing the test after eventually;
// detail, if given, says what was last seen.
func waitUntil(t *testing.T, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(eventually)
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

func httpGet(url string) (int, string) {
	resp, err := httpClient().Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// watchSDSCertificates asks the agent's SDS server for "default" as Envoy
// does, and sends the leaf of every new certificate it pushes. Like Envoy,
// it reconnects when the stream ends (the SDS server restarted).
func watchSDSCertificates(t *testing.T, socket string) <-chan *x509.Certificate {
	t.Helper()
	waitUntil(t, "the SDS socket", func() bool { _, err := os.Stat(socket); return err == nil })
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
			last = streamSDSCertificates(ctx, conn, out, last)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait(); conn.Close() })
	return out
}

// streamSDSCertificates is one SDS stream of watchSDSCertificates, until it
// ends; it returns the leaf it last sent.
func streamSDSCertificates(ctx context.Context, conn *grpc.ClientConn, out chan<- *x509.Certificate, last []byte) []byte {
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

// nextCertificate is the next certificate pushed over SDS.
func nextCertificate(t *testing.T, certs <-chan *x509.Certificate, what string) *x509.Certificate {
	t.Helper()
	select {
	case c := <-certs:
		return c
	case <-time.After(eventually):
		t.Fatalf("no %s over SDS", what)
		return nil
	}
}

func readCertificate(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	waitUntil(t, path, func() bool { _, err := os.Stat(path); return err == nil })
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return pki.ParseLeaf(t, b)
}

// startUpstreamResolver is the test kit's dnsmasq, answering
// *.upstream.test with 192.0.2.77. It returns its address, or "" when it
// cannot run here (no dnsmasq, or not root: port 53).
func startUpstreamResolver(t *testing.T) string {
	t.Helper()
	ip, why := testkit.Dnsmasq(t)
	if ip == "" {
		t.Log(why)
	}
	return ip
}
