package sds

import (
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

func crlOf(r *discoveryv3.DiscoveryResponse, t *testing.T) string {
	return string(decode(t, r)[RootCertResourceName].GetValidationContext().GetCrl().GetInlineBytes())
}

// The plugged-in CA's CRL file is in ROOTCA while it exists, and every
// change of it (written, replaced, removed) is pushed.
func TestCRLInROOTCAAndPushedOnChange(t *testing.T) {
	s := newServer(t)
	os.MkdirAll(filepath.Dir(s.cfg.CRLFile), 0o755)
	s.start(t)
	s.certs.Send(bundle(1))
	names := []string{RootCertResourceName}
	c := s.open(t, names...)
	r := c.recv(t)
	if crlOf(r, t) != "" {
		t.Fatal("a CRL without a CRL file")
	}
	c.ack(t, r, names...)

	ca := pki.NewRoot(t, "plugged-in ca")
	crl1, crl2 := ca.CRL(t, 1, 1001), ca.CRL(t, 2, 1001, 1002)
	s.write(t, s.cfg.CRLFile, crl1)
	r = c.recvUntil(t, "the CRL", names, func(r *discoveryv3.DiscoveryResponse) bool { return crlOf(r, t) == string(crl1) })
	if trustedCA(decode(t, r)[RootCertResourceName]) != "roots-1" {
		t.Fatal("roots lost when the CRL was added")
	}
	rename(t, s.cfg.CRLFile, crl2)
	c.recvUntil(t, "the new CRL", names, func(r *discoveryv3.DiscoveryResponse) bool { return crlOf(r, t) == string(crl2) })
	os.Remove(s.cfg.CRLFile)
	c.recvUntil(t, "no CRL", names, func(r *discoveryv3.DiscoveryResponse) bool { return crlOf(r, t) == "" })
	s.waitHealth(t, messages.Ready, "")

	// An empty file (a CRL volume mounted with nothing in it) is no CRL,
	// as for Envoy: ROOTCA is served without one, not refused.
	s.write(t, s.cfg.CRLFile, crl1)
	c.recvUntil(t, "the CRL again", names, func(r *discoveryv3.DiscoveryResponse) bool { return crlOf(r, t) == string(crl1) })
	rename(t, s.cfg.CRLFile, []byte("\n"))
	r = c.recvUntil(t, "no CRL from an empty file", names, func(r *discoveryv3.DiscoveryResponse) bool {
		_, ok := decode(t, r)[RootCertResourceName]
		return ok && crlOf(r, t) == ""
	})
	if len(r.ResourceErrors) != 0 {
		t.Fatalf("an empty CRL file gave errors %v", r.ResourceErrors)
	}
	s.waitHealth(t, messages.Ready, "")
}

// The CRL directory may appear after the start (a CA plugged in later).
func TestCRLDirectoryAppearsLate(t *testing.T) {
	s := startServer(t)
	s.certs.Send(bundle(1))
	names := []string{RootCertResourceName}
	c := s.open(t, names...)
	c.ack(t, c.recv(t), names...)
	crl := pki.NewRoot(t, "ca").CRL(t, 1, 7)
	s.write(t, s.cfg.CRLFile, crl)
	c.recvUntil(t, "the CRL", names, func(r *discoveryv3.DiscoveryResponse) bool { return crlOf(r, t) == string(crl) })
}

// A CRL file that cannot be used keeps the last good CRL, with the error on
// ROOTCA and in Health. With none before it, ROOTCA is not served: roots
// without the CA's CRL would trust what the CA revoked.
func TestBadCRLKeepsLastGoodAndFailsClosed(t *testing.T) {
	s := newServer(t)
	ca := pki.NewRoot(t, "ca")
	good := ca.CRL(t, 1, 5)
	s.write(t, s.cfg.CRLFile, []byte("-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n"))
	s.certs.Send(bundle(1))
	names := []string{RootCertResourceName, WorkloadKeyCertResourceName}
	s.start(t)
	c := s.open(t, names...)
	r := c.recv(t)
	if _, ok := decode(t, r)[RootCertResourceName]; ok {
		t.Fatal("ROOTCA served without the CRL the file should hold")
	}
	st := resourceErrors(r)[RootCertResourceName]
	if st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), s.cfg.CRLFile) {
		t.Fatalf("ROOTCA error %v; want FailedPrecondition naming the CRL file", st)
	}
	s.waitHealth(t, messages.Degraded, s.cfg.CRLFile)
	c.ack(t, r, names...)

	rename(t, s.cfg.CRLFile, good)
	c.recvUntil(t, "ROOTCA with the CRL", names, func(r *discoveryv3.DiscoveryResponse) bool { return crlOf(r, t) == string(good) })
	s.waitHealth(t, messages.Ready, "")

	rename(t, s.cfg.CRLFile, []byte("junk"))
	r = c.recvUntil(t, "the CRL error", names, func(r *discoveryv3.DiscoveryResponse) bool { return len(r.ResourceErrors) == 1 })
	if crlOf(r, t) != string(good) {
		t.Fatal("the last good CRL was not kept")
	}
	s.waitHealth(t, messages.Degraded, "no PEM X509 CRL")
}

// PILOT_ENABLE_CA_CRL=false: no CRL file, whatever is on disk.
func TestCRLDisabled(t *testing.T) {
	s := newServer(t, func(c *Config) { c.CRLFile = "" })
	s.write(t, filepath.Join(s.root, testCRLPath), pki.NewRoot(t, "ca").CRL(t, 1, 5))
	s.start(t)
	s.certs.Send(bundle(1))
	if got := crlOf(s.open(t, RootCertResourceName).recv(t), t); got != "" {
		t.Fatal("CRL served with CRLFile empty")
	}
}

// The extra trust anchors (ProxyConfig caCertificatesPem, from the XDS
// proxy) are merged into ROOTCA after the mesh roots, each certificate
// once, the ones that do not parse left out; a change of them is pushed, an
// identical set is not.
func TestTrustAnchorsMergedIntoROOTCA(t *testing.T) {
	s := startServer(t)
	mesh, extra1, extra2 := pki.NewRoot(t, "mesh"), pki.NewRoot(t, "extra 1"), pki.NewRoot(t, "extra 2")
	b := bundle(1)
	b.RootsPEM = mesh.CertPEM
	names := []string{RootCertResourceName}
	c := s.open(t, names...)

	// Anchors before the first bundle: ROOTCA still waits for the bundle.
	s.anchors.Send(messages.TrustAnchors{PEM: [][]byte{extra1.CertPEM}, Version: "a1"})
	c.expectNothing(t, 100*time.Millisecond)
	s.certs.Send(b)
	r := c.recv(t)
	if got := trustedCA(decode(t, r)[RootCertResourceName]); got != string(mesh.CertPEM)+string(extra1.CertPEM) {
		t.Fatalf("ROOTCA is not mesh + extra:\n%s", got)
	}
	c.ack(t, r, names...)

	// The mesh root again (re-wrapped: other line breaks), extra 1 twice,
	// extra 2, and one that does not parse.
	block, _ := pem.Decode(mesh.CertPEM)
	rewrapped := []byte("-----BEGIN CERTIFICATE-----\n" + strings.Join(chunks(pemBody(block.Bytes), 76), "\n") + "\n-----END CERTIFICATE-----\n")
	bad := []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
	s.anchors.Send(messages.TrustAnchors{PEM: [][]byte{rewrapped, extra1.CertPEM, append(append([]byte{}, extra1.CertPEM...), extra2.CertPEM...), bad}, Version: "a2"})
	r = c.recv(t)
	want := string(mesh.CertPEM) + string(extra1.CertPEM) + string(extra2.CertPEM)
	if got := trustedCA(decode(t, r)[RootCertResourceName]); got != want {
		t.Fatalf("ROOTCA not deduplicated:\n%s\nwant\n%s", got, want)
	}
	s.logs.WaitLine(t, "ignoring an extra trust anchor", "trust anchor #4")
	c.ack(t, r, names...)

	s.anchors.Send(messages.TrustAnchors{PEM: [][]byte{extra1.CertPEM, extra2.CertPEM}, Version: "a3"})
	c.expectNothing(t, 200*time.Millisecond) // same certificates: nothing new for Envoy

	s.anchors.Send(messages.TrustAnchors{Version: "a4"})
	r = c.recv(t)
	if got := trustedCA(decode(t, r)[RootCertResourceName]); got != string(mesh.CertPEM) {
		t.Fatalf("anchors removed, ROOTCA still\n%s", got)
	}
}

func pemBody(der []byte) string {
	s := string(pem.EncodeToMemory(&pem.Block{Type: "X", Bytes: der}))
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[1:len(lines)-1], "")
}

func chunks(s string, n int) []string {
	var out []string
	for len(s) > n {
		out, s = append(out, s[:n]), s[n:]
	}
	return append(out, s)
}
