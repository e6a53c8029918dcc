package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestWorkloadVerifiesWithItsSPIFFEID(t *testing.T) {
	root := NewRoot(t, "test root")
	chain, key := root.Workload(t, 2*time.Hour)
	if _, err := tls.X509KeyPair(chain, key); err != nil {
		t.Fatal(err)
	}
	leaf := ParseLeaf(t, chain)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: root.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatal(err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != WorkloadID {
		t.Errorf("URIs %v", leaf.URIs)
	}
	if got := leaf.NotAfter.Sub(leaf.NotBefore); got != 2*time.Hour {
		t.Errorf("lifetime %v", got)
	}
	if other := NewRoot(t, "other"); other.Cert.Equal(root.Cert) {
		t.Error("two roots are the same")
	}
}

func TestExpiredLeaf(t *testing.T) {
	root := NewRoot(t, "test root")
	chain, _ := root.Leaf(t, Leaf{SPIFFE: WorkloadID, NotAfter: time.Now().Add(-time.Minute)})
	leaf := ParseLeaf(t, chain)
	if !leaf.NotAfter.Before(time.Now()) || !leaf.NotBefore.Before(leaf.NotAfter) {
		t.Fatalf("valid %v to %v", leaf.NotBefore, leaf.NotAfter)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: root.Pool()}); err == nil {
		t.Fatal("an expired certificate verifies")
	}
}

func TestServerTLS(t *testing.T) {
	root := NewRoot(t, "test root")
	lis, err := tls.Listen("tcp", "127.0.0.1:0", root.ServerTLS(t, "istiod.istio-system.svc", "127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	testkit.AcceptAndClose(t, lis)
	for _, name := range []string{"istiod.istio-system.svc", "127.0.0.1"} {
		c, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: root.Pool(), ServerName: name})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c.Close()
	}
}

func TestCRL(t *testing.T) {
	root := NewRoot(t, "test root")
	crlPEM := root.CRL(t, 3, 7, 9)
	block, _ := pem.Decode(crlPEM)
	if block == nil || block.Type != "X509 CRL" {
		t.Fatalf("not a PEM CRL: %q", crlPEM)
	}
	crl, err := x509.ParseRevocationList(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := crl.CheckSignatureFrom(root.Cert); err != nil {
		t.Fatal(err)
	}
	if crl.Number.Cmp(big.NewInt(3)) != 0 || len(crl.RevokedCertificateEntries) != 2 || crl.RevokedCertificateEntries[1].SerialNumber.Int64() != 9 {
		t.Fatalf("CRL %v revokes %v", crl.Number, crl.RevokedCertificateEntries)
	}
}

// A chain is its certificates in order; other blocks (a key) are skipped.
func TestParseChain(t *testing.T) {
	root := NewRoot(t, "test root")
	leafPEM, keyPEM := root.Workload(t, time.Hour)
	chain, err := ParseChain(append(append(append([]byte{}, leafPEM...), keyPEM...), certPEM(root.Cert.Raw)...))
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 || !chain[0].Equal(ParseLeaf(t, leafPEM)) || !chain[1].Equal(root.Cert) {
		t.Fatalf("chain = %d certificates, want the leaf then the root", len(chain))
	}
	if _, err := ParseChain(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")})); err == nil {
		t.Error("a CERTIFICATE block that does not parse is not an error")
	}
}
