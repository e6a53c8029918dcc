// Package pki is the test PKI: certificate authorities and certificates
// made in the test with crypto/x509, ECDSA P-256 for speed. One
// implementation for every test that needs a root, a workload certificate
// with a SPIFFE ID, an expired one, a server certificate or a CRL, and for
// testdata/devcerts, which writes a throwaway identity for `make run`.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"time"
)

// T is what the PKI needs of its caller: a testing.TB, or a command's
// stand-in that exits on Fatal (testdata/devcerts).
type T interface {
	Helper()
	Fatal(args ...any)
}

// WorkloadID is the SPIFFE ID of Workload's certificates.
const WorkloadID = "spiffe://cluster.local/ns/default/sa/default"

// CA is a certificate authority: a self-signed root.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

// NewRoot is a root named name, valid from an hour ago for a day.
func NewRoot(t T, name string) *CA {
	t.Helper()
	return NewRootUntil(t, name, time.Now().Add(24*time.Hour))
}

// NewRootUntil is a root named name, valid from an hour ago until
// notAfter.
func NewRootUntil(t T, name string, notAfter time.Time) *CA {
	t.Helper()
	key := NewKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM(der)}
}

// NewKey is a fresh ECDSA P-256 key.
func NewKey(t T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// KeyPEM is key as PKCS#8 PEM ("PRIVATE KEY"), as Istio writes keys.
func KeyPEM(t T, key crypto.Signer) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// Pool is a pool holding the CA's certificate.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

// Leaf is what a certificate the CA issues holds besides its key.
type Leaf struct {
	// SPIFFE is the URI SAN; empty for none.
	SPIFFE string
	// DNSNames and IPs are the host SANs of a server certificate.
	DNSNames []string
	IPs      []net.IP
	// NotBefore is zero for now, or an hour before NotAfter when
	// NotAfter is earlier than now (an expired certificate).
	NotBefore time.Time
	// NotAfter is zero for NotBefore plus Lifetime.
	NotAfter time.Time
	// Lifetime is zero for an hour.
	Lifetime time.Duration
}

// Workload is a workload certificate for WorkloadID, valid for lifetime
// from now: its chain and its key, both PEM.
func (ca *CA) Workload(t T, lifetime time.Duration) (chainPEM, keyPEM []byte) {
	t.Helper()
	return ca.Leaf(t, Leaf{SPIFFE: WorkloadID, Lifetime: lifetime})
}

// Leaf issues a certificate for a fresh key: its chain and its key, both
// PEM.
func (ca *CA) Leaf(t T, l Leaf) (chainPEM, keyPEM []byte) {
	t.Helper()
	key := NewKey(t)
	return ca.Sign(t, key.Public(), l), KeyPEM(t, key)
}

// Sign issues a certificate for pub, for a serving and client TLS
// identity, with a random serial; it returns the certificate's PEM.
func (ca *CA) Sign(t T, pub crypto.PublicKey, l Leaf) []byte {
	t.Helper()
	lifetime := l.Lifetime
	if lifetime == 0 {
		lifetime = time.Hour
	}
	now := time.Now()
	notBefore, notAfter := l.NotBefore, l.NotAfter
	if notBefore.IsZero() {
		notBefore = now
		if !notAfter.IsZero() && notAfter.Before(now) {
			notBefore = notAfter.Add(-time.Hour)
		}
	}
	if notAfter.IsZero() {
		notAfter = notBefore.Add(lifetime)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "workload"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		DNSNames:     l.DNSNames,
		IPAddresses:  l.IPs,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if l.SPIFFE != "" {
		u, err := url.Parse(l.SPIFFE)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM(der)
}

// ServerTLS is a server's TLS configuration with a certificate from the CA
// for hosts (names or IPs).
func (ca *CA) ServerTLS(t T, hosts ...string) *tls.Config {
	t.Helper()
	var l Leaf
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			l.IPs = append(l.IPs, ip)
		} else {
			l.DNSNames = append(l.DNSNames, h)
		}
	}
	chain, key := ca.Leaf(t, l)
	pair, err := tls.X509KeyPair(chain, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

// CRL is a PEM CRL of the CA, numbered number, that revokes serials.
func (ca *CA) CRL(t T, number int64, serials ...int64) []byte {
	t.Helper()
	now := time.Now()
	tmpl := &x509.RevocationList{Number: big.NewInt(number), ThisUpdate: now.Add(-time.Minute), NextUpdate: now.Add(time.Hour)}
	for _, s := range serials {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries,
			x509.RevocationListEntry{SerialNumber: big.NewInt(s), RevocationTime: now.Add(-time.Minute)})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.Cert, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der})
}

// ParseLeaf is the first certificate in PEM bytes: a chain's leaf.
func ParseLeaf(t T, chainPEM []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(chainPEM)
	if block == nil {
		t.Fatal("no PEM certificate")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ParseChain is every CERTIFICATE block of chainPEM, in order (other
// blocks skipped), for a test that reads a chain someone else wrote.
func ParseChain(chainPEM []byte) ([]*x509.Certificate, error) {
	var chain []*x509.Certificate
	for rest := chainPEM; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return chain, nil
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		chain = append(chain, c)
	}
}

func certPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
