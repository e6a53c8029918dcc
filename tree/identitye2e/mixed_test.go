package identitye2e

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/sds"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/istioca"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// caAgent is an agent whose CA client can reach ca.
func caAgent(t *testing.T, ca *istioca.CA) *agent {
	a := newAgent(t)
	a.certCfg.CAAddr = ca.Addr
	a.certCfg.KeyAlgorithm = certs.ECDSA
	a.certCfg.FileDebounce = 20 * time.Millisecond
	os.MkdirAll(filepath.Dir(a.certCfg.CARootFile), 0o755)
	testkit.WriteFile(t, a.certCfg.CARootFile, ca.Root.CertPEM)
	os.MkdirAll(filepath.Dir(a.certCfg.TokenFile), 0o755)
	testkit.WriteFile(t, a.certCfg.TokenFile, []byte(testToken))
	return a
}

func spiffeIDOf(t *testing.T, s *tlsv3.Secret) string {
	t.Helper()
	c := pki.ParseLeaf(t, s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
	if len(c.URIs) == 0 {
		t.Fatal("workload certificate without a URI SAN")
	}
	return c.URIs[0].String()
}

// Istio's mixed mode with a mounted root-cert.pem and no certificate: Envoy
// gets the CA's certificate as "default" and the mounted roots as "ROOTCA";
// a new mounted root is pushed as ROOTCA alone.
func TestMixedModeCertificateFromCARootsFromFile(t *testing.T) {
	ca := startCA(t, time.Hour)
	a := caAgent(t, ca)
	mounted := pki.NewRoot(t, "e2e root")
	rootFile := filepath.Join(a.root, etcCertsDir, certs.RootCertFileName)
	os.MkdirAll(filepath.Dir(rootFile), 0o755)
	testkit.WriteFile(t, rootFile, mounted.CertPEM)
	a.certCfg = a.chooseSource(false)
	a.start(t)

	names := []string{sds.WorkloadKeyCertResourceName, sds.RootCertResourceName}
	e := a.connect(t, names...)
	got := e.until(t, "both secrets", func(s map[string]*tlsv3.Secret, _ map[string]*status.Status) bool { return len(s) == 2 })
	if id := spiffeIDOf(t, got[sds.WorkloadKeyCertResourceName]); id != a.certCfg.SpiffeID() {
		t.Fatalf("default is not the CA's certificate for %s: %s", a.certCfg.SpiffeID(), id)
	}
	if trustedCA(got[sds.RootCertResourceName]) != string(mounted.CertPEM) {
		t.Fatal("ROOTCA is not the mounted root-cert.pem")
	}

	next := pki.NewRoot(t, "e2e root")
	renameInto(t, rootFile, next.CertPEM)
	before := chainOf(got[sds.WorkloadKeyCertResourceName])
	e.until(t, "the new mounted root", func(s map[string]*tlsv3.Secret, _ map[string]*status.Status) bool {
		return trustedCA(s[sds.RootCertResourceName]) == string(next.CertPEM)
	})
	if slices.Contains(e.lastSent, sds.WorkloadKeyCertResourceName) || chainOf(e.have[sds.WorkloadKeyCertResourceName]) != before {
		t.Fatal("the workload certificate was pushed with the root file")
	}
	e.expectNothing(t, 200*time.Millisecond)
}

// Istio's mixed mode the other way: a mounted certificate and key but no
// root-cert.pem: "default" is the mounted certificate, "ROOTCA" the CA's
// root.
func TestMixedModeCertificateFromFilesRootsFromCA(t *testing.T) {
	ca := startCA(t, time.Hour)
	a := caAgent(t, ca)
	files := pki.NewRoot(t, "e2e root")
	dir := filepath.Join(a.root, etcCertsDir)
	os.MkdirAll(dir, 0o755)
	chain, key := files.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
	a.keys = append(a.keys, key)
	testkit.WriteFile(t, filepath.Join(dir, certs.CertChainFileName), chain)
	testkit.WriteFile(t, filepath.Join(dir, certs.KeyFileName), key)
	a.certCfg = a.chooseSource(false)
	a.start(t)

	e := a.connect(t, sds.WorkloadKeyCertResourceName, sds.RootCertResourceName)
	got := e.until(t, "both secrets", func(s map[string]*tlsv3.Secret, _ map[string]*status.Status) bool { return len(s) == 2 })
	if chainOf(got[sds.WorkloadKeyCertResourceName]) != string(chain) {
		t.Fatal("default is not the mounted certificate")
	}
	if trustedCA(got[sds.RootCertResourceName]) != string(ca.Root.CertPEM) {
		t.Fatal("ROOTCA is not the CA's root")
	}
}
