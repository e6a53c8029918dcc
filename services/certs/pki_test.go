package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"
)

// testPKI is a root CA made in the test with crypto/x509.
type testPKI struct {
	root    *x509.Certificate
	rootKey crypto.Signer
	rootPEM []byte
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{Organization: []string{"meshagent test root"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := x509.ParseCertificate(der)
	return &testPKI{root: root, rootKey: key, rootPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs pub for the given lifetime starting now.
func (p *testPKI) issue(t testing.TB, pub crypto.PublicKey, lifetime time.Duration, uris []*url.URL, ips []net.IP) []byte {
	t.Helper()
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "workload"},
		NotBefore:    now,
		NotAfter:     now.Add(lifetime),
		URIs:         uris,
		IPAddresses:  ips,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.root, pub, p.rootKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// leaf returns a fresh key (PKCS#8 PEM) and its certificate chain PEM.
func (p *testPKI) leaf(t testing.TB, lifetime time.Duration) (chainPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	id, _ := url.Parse("spiffe://cluster.local/ns/default/sa/test")
	return p.issue(t, key.Public(), lifetime, []*url.URL{id}, nil), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// leafFor returns a server certificate (chain, key PEM) for the given IPs.
func (p *testPKI) leafFor(t testing.TB, ips []net.IP) (chainPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	return p.issue(t, key.Public(), time.Hour, nil, ips), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}
