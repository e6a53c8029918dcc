package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// `meshagent standalone` as a new user runs it: the real binary with the
// sample mesh, in a temp root, every port moved to a free one, and a
// resolver of the test's own as the DNS proxy's upstream.

// sampleMesh is a copy of testdata/standalone/mesh.yaml in a directory of
// the test's own (the control plane watches the file's directory, and a
// test may rewrite the file), and the sample's content.
func sampleMesh(t *testing.T) (path string, sample []byte) {
	t.Helper()
	sample, err := os.ReadFile("../../../testdata/standalone/mesh.yaml")
	if err != nil {
		t.Fatal(err)
	}
	mesh := filepath.Join(t.TempDir(), "mesh.yaml")
	testkit.WriteFile(t, mesh, sample)
	return mesh, sample
}

// The whole mesh on one machine: the agent comes to ready on its own, the
// peers are in its tree, its certificate comes from the embedded CA over
// its real CA client and rotates, Envoy holds the sample's clusters, DNS
// answers the sample's names from NDS, an edit of the YAML reaches both, a
// bad edit keeps the last good mesh and says why, a killed control plane
// comes back, and Ctrl-C stops it all.
func TestStandaloneRunsTheSampleMesh(t *testing.T) {
	mesh, sample := sampleMesh(t)
	upstream := e2ekit.StartUpstreamResolver(t)
	p := e2ekit.StartStandalone(t, mesh, upstream, "--cert-lifetime", "10s")

	p.WaitStatus(t, "/healthz/ready", 200)
	tree := p.WaitStatus(t, "/debug/tree", 200)
	for _, node := range []string{"── peers", "── controlplane", "── ca ", "── certs", "── xds", "── dns", "── envoy"} {
		if !strings.Contains(tree, node) {
			t.Errorf("/debug/tree lacks %q:\n%s", node, tree)
		}
	}

	// The certificate Envoy gets over SDS was signed by the embedded CA for
	// the agent's identity, and a new one is pushed before it expires.
	caRoot := e2ekit.ReadCertificate(t, filepath.Join(p.Root, "var/lib/meshagent/ca/root-cert.pem"))
	certsOverSDS := e2ekit.WatchSDSCertificates(t, filepath.Join(p.Root, "var/run/secrets/workload-spiffe-uds/socket"))
	first := e2ekit.NextCertificate(t, certsOverSDS, "certificate")
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
	p.WaitConfigDump(t, reviews, "outbound|7070||ratings.default.svc.cluster.local")
	for name, want := range map[string]string{
		"reviews.default.svc.cluster.local": "10.96.0.10",
		"reviews":                           "10.96.0.10", // Kubernetes short name, the pod being in default
		"ratings.default":                   "10.96.0.11",
		"api.example.com":                   "240.240.0.10",
	} {
		p.WaitDNS(t, name, want)
	}
	if upstream != "" {
		p.WaitDNS(t, "anything.upstream.test", "192.0.2.77") // not in the mesh: forwarded to --resolv-conf's resolver
	}

	// The control plane is a restartable service like any other; the
	// restarted one serves the next edit.
	if code, err := e2ekit.PostTo(p.Base + "/debug/chaos/kill?service=controlplane"); err != nil || code != 200 {
		t.Fatalf("chaos kill controlplane: %d %v", code, err)
	}
	p.WaitLog(t, "the control plane's restart", func(log string) bool {
		return strings.Contains(log, `msg="service failed; restarting" service=controlplane`)
	})

	// Add a service: Envoy gets its cluster and DNS its name.
	details := "  - name: details\n    namespace: default\n    vip: 10.96.0.12\n    ports:\n" +
		"      - port: 9080\n        protocol: http\n        endpoints: [127.0.0.1:19083]\n\n"
	edited := strings.Replace(string(sample), "externalNames:", details+"externalNames:", 1)
	testkit.WriteFile(t, mesh, []byte(edited))
	p.WaitConfigDump(t, "outbound|9080||details.default.svc.cluster.local")
	p.WaitDNS(t, "details.default.svc.cluster.local", "10.96.0.12")

	// A bad edit is rejected whole: the last good mesh stays served, the
	// agent stays ready, and the control plane's line in /debug/tree says
	// why.
	bad := strings.Replace(edited, "vip: 10.96.0.12", "vip: 10.96.0.300", 1)
	testkit.WriteFile(t, mesh, []byte(bad))
	// The control plane names the line of the service that is wrong.
	badLine := fmt.Sprintf("line %d", 1+strings.Count(bad[:strings.Index(bad, "- name: details")], "\n"))
	p.WaitTreeLine(t, "── controlplane", "rejected")
	if line := p.TreeLine(t, "── controlplane"); !strings.Contains(line, "degraded") || !strings.Contains(line, badLine) {
		t.Errorf("controlplane in /debug/tree: %q, want degraded, naming %s", line, badLine)
	}
	p.WaitDNS(t, "details.default.svc.cluster.local", "10.96.0.12")
	if _, dump := e2ekit.HTTPGet(fmt.Sprintf("http://127.0.0.1:%d/config_dump", p.AdminPort)); !strings.Contains(dump, "outbound|9080||details.default.svc.cluster.local") {
		t.Error("after a bad mesh edit, Envoy lost the last good mesh's details cluster")
	}
	if code, body := p.Get("/healthz/ready"); code != 200 {
		t.Errorf("after a bad mesh edit: ready = %d %s, want 200 (the last good mesh is served)", code, body)
	}

	// The first certificate lives 10s: its successor is pushed before it
	// expires, on the same stream.
	second := e2ekit.NextCertificate(t, certsOverSDS, "rotated certificate")
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 || !second.NotAfter.After(first.NotAfter) {
		t.Errorf("rotated certificate: serial %x until %v; the first: serial %x until %v",
			second.SerialNumber, second.NotAfter, first.SerialNumber, first.NotAfter)
	}
	if err := second.CheckSignatureFrom(caRoot); err != nil {
		t.Errorf("the rotated certificate is not the embedded CA's: %v", err)
	}

	// Ctrl-C drains Envoy and stops everything, peers included.
	if log := p.StopWith(t, syscall.SIGINT); !strings.Contains(log, "meshagent stopped") {
		t.Errorf("no clean stop in the log")
	}
}
