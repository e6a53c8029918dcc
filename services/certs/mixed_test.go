package certs

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// Istio's mixed mode, first half: <root>/etc/certs/root-cert.pem is mounted
// but no certificate, so the certificate comes from the CA and the roots
// from the file, followed as file-mounted certificates are.
func TestMixedCertificateFromCARootsFromFile(t *testing.T) {
	c := newCASetup(t, time.Hour)
	mounted := pki.NewRoot(t, "meshagent test root")
	rootFile := filepath.Join(c.root, testEtcCertsDir, RootCertFileName)
	testkit.WriteFile(t, rootFile, mounted.CertPEM)
	c.cfg = chooseSource(c.cfg, c.root, false)
	if c.cfg.Source != SourceCA || c.cfg.Roots != RootsFromFile {
		t.Fatalf("chose %v / %v; want the CA's certificate with the file's roots", c.cfg.Source, c.cfg.Roots)
	}
	c.cfg.FileDebounce = 20 * time.Millisecond
	c.ca.Start(t)
	c.start(t)
	b1 := c.out.WaitLast(t, "a bundle", func(b messages.CertBundle) bool { return b.Version != "" })
	chain, err := parseCerts(b1.CertChainPEM)
	if err != nil || chain[0].URIs[0].String() != c.cfg.SpiffeID() {
		t.Fatalf("certificate is not the CA's: %v", err)
	}
	if string(b1.RootsPEM) != string(mounted.CertPEM) {
		t.Fatal("roots are not the mounted root-cert.pem")
	}
	c.health.WaitState(t, messages.Ready, "")

	// A new mounted root: the same certificate, the new roots, no CA call.
	next := pki.NewRoot(t, "meshagent test root")
	testkit.WriteFile(t, rootFile, append(append([]byte{}, mounted.CertPEM...), next.CertPEM...))
	b2 := c.out.WaitLast(t, "the new roots", func(b messages.CertBundle) bool { return len(b.RootsPEM) > len(mounted.CertPEM) })
	if string(b2.CertChainPEM) != string(b1.CertChainPEM) || b2.Version == b1.Version {
		t.Fatal("a roots change must keep the certificate and change the version")
	}
	if n := c.ca.Requests(t); n != 1 {
		t.Fatalf("%d CA calls; a root file change must not ask the CA", n)
	}

	// A bad root file keeps the last good roots and says why.
	testkit.WriteFile(t, rootFile, []byte("garbage"))
	c.health.WaitState(t, messages.Degraded, rootFile)
	if got, _ := c.out.Get(); got.Version != b2.Version {
		t.Fatal("a bad root file replaced the bundle")
	}
}

// Istio's mixed mode, second half: cert-chain.pem and key.pem are mounted
// but no root-cert.pem, so the certificate comes from the files and the
// roots from the CA (Istio asks the CA for a certificate to learn them).
func TestMixedCertificateFromFilesRootsFromCA(t *testing.T) {
	c := newCASetup(t, time.Hour)
	files, dir := pki.NewRoot(t, "meshagent test root"), filepath.Join(c.root, testEtcCertsDir)
	chain1, key1 := c.mountCertificate(t, files)
	if c.cfg.Source != SourceFiles || c.cfg.Roots != RootsFromCA {
		t.Fatalf("chose %v / %v; want the files' certificate with the CA's roots", c.cfg.Source, c.cfg.Roots)
	}
	c.cfg.FileDebounce = 20 * time.Millisecond
	c.start(t) // the CA is down at first
	c.health.WaitState(t, messages.Starting, "waiting for the trusted roots from the CA")
	if _, ok := c.out.Get(); ok {
		t.Fatal("published without roots")
	}
	c.ca.Start(t)
	b1 := c.out.WaitLast(t, "a bundle", func(b messages.CertBundle) bool { return b.Version != "" })
	if string(b1.CertChainPEM) != string(chain1) || string(b1.KeyPEM) != string(key1) {
		t.Fatal("certificate is not the mounted one")
	}
	if string(b1.RootsPEM) != string(c.ca.Root.CertPEM) {
		t.Fatal("roots are not the CA's")
	}
	c.health.WaitState(t, messages.Ready, "")

	// The mounted certificate rotates: the CA's roots stay, no CA call.
	chain2, key2 := files.Leaf(t, pki.Leaf{SPIFFE: testWorkloadID, Lifetime: time.Hour})
	os.WriteFile(filepath.Join(dir, KeyFileName), key2, 0o600)
	os.WriteFile(filepath.Join(dir, CertChainFileName), chain2, 0o600)
	b2 := c.out.WaitLast(t, "the rotated certificate", func(b messages.CertBundle) bool { return string(b.CertChainPEM) == string(chain2) })
	if string(b2.RootsPEM) != string(c.ca.Root.CertPEM) {
		t.Fatal("roots lost on rotation")
	}
	if n := c.ca.Requests(t); n != 1 {
		t.Fatalf("%d CA calls; want 1 (for the roots)", n)
	}
}

// The CA's roots are asked for again at the renewal point of the
// certificate the CA answered with, so that a new mesh root gets through.
func TestMixedRootsFromCARefreshed(t *testing.T) {
	c := newCASetup(t, 3*time.Second)
	c.mountCertificate(t, pki.NewRoot(t, "meshagent test root"))
	c.ca.Start(t)
	c.start(t)
	c.out.WaitLast(t, "a bundle", func(b messages.CertBundle) bool { return b.Version != "" })
	testkit.WaitFor(t, "the CA's roots asked for again", func() bool { return c.ca.Requests(t) >= 2 })
	if c.out.Len() != 1 {
		t.Fatalf("%d bundles; the same roots again must publish nothing", c.out.Len())
	}
}

// mountCertificate is Istio's mixed mode with the certificate mounted: a
// fresh one from files in etc/certs, with no root-cert.pem, and the
// source chosen for it.
func (c *caSetup) mountCertificate(t *testing.T, files *pki.CA) (chain, key []byte) {
	t.Helper()
	dir := filepath.Join(c.root, testEtcCertsDir)
	chain, key = files.Leaf(t, pki.Leaf{SPIFFE: testWorkloadID, Lifetime: time.Hour})
	testkit.WriteFile(t, filepath.Join(dir, CertChainFileName), chain)
	testkit.WriteFile(t, filepath.Join(dir, KeyFileName), key)
	c.cfg = chooseSource(c.cfg, c.root, false)
	return chain, key
}
