package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/meshagent/meshagent/services/internal/atomicfile"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/services/internal/pemblock"
)

// rootLifetime is the generated root's lifetime: long, since nothing
// rotates it (delete RootDir to start over).
const rootLifetime = 10 * 365 * 24 * time.Hour

// servingLifetime is the serving certificate's, issued afresh at every
// start of the service.
const servingLifetime = 365 * 24 * time.Hour

// ErrHalfRoot: one of the root's two files is there without the other.
var ErrHalfRoot = errors.New("root certificate and key must both exist, or neither")

// authority is the root the CA signs with. It does not change while the
// service runs, so the handler reads it without a lock.
type authority struct {
	cert    *x509.Certificate
	certPEM []byte
	key     crypto.Signer
}

// loadOrCreateRoot reads the root from the config's files, or generates
// and writes it when neither exists.
func loadOrCreateRoot(cfg Config, now time.Time) (*authority, bool, error) {
	certPath, keyPath := cfg.RootCertPath(), cfg.RootKeyPath()
	certPEM, certErr := boundedfile.Read(certPath, boundedfile.MaxPEM)
	keyPEM, keyErr := boundedfile.Read(keyPath, boundedfile.MaxPEM)
	switch {
	case errors.Is(certErr, os.ErrNotExist) && errors.Is(keyErr, os.ErrNotExist):
		a, err := createRoot(cfg, now)
		return a, true, err
	case errors.Is(certErr, os.ErrNotExist):
		return nil, false, fmt.Errorf("ca root: %s exists without %s: %w (remove it to generate a new root)", keyPath, certPath, ErrHalfRoot)
	case errors.Is(keyErr, os.ErrNotExist):
		return nil, false, fmt.Errorf("ca root: %s exists without %s: %w (remove it to generate a new root)", certPath, keyPath, ErrHalfRoot)
	case certErr != nil:
		return nil, false, fmt.Errorf("ca root: %w", certErr)
	case keyErr != nil:
		return nil, false, fmt.Errorf("ca root: %w", keyErr)
	}
	a, err := parseRoot(certPEM, keyPEM, now)
	if err != nil {
		return nil, false, fmt.Errorf("ca root %s, %s: %w", certPath, keyPath, err)
	}
	return a, false, nil
}

// parseRoot checks that the pair is a usable CA: a CA certificate, valid
// now, whose public key is the key's.
func parseRoot(certPEM, keyPEM []byte, now time.Time) (*authority, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM CERTIFICATE in the certificate file")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("certificate is not a CA certificate (basic constraints CA and key usage cert sign)")
	}
	if now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return nil, fmt.Errorf("certificate is valid from %s to %s, not now", cert.NotBefore.UTC().Format(time.RFC3339), cert.NotAfter.UTC().Format(time.RFC3339))
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("the key does not match the certificate")
	}
	return &authority{cert: cert, certPEM: pem.EncodeToMemory(block), key: key}, nil
}

// parseKey reads PKCS#8, EC and PKCS#1 RSA keys: a root made elsewhere
// (Istio's tooling writes PKCS#1 RSA) can be dropped in. It must be ECDSA
// or RSA, what x509 signs certificates with.
func parseKey(keyPEM []byte) (crypto.Signer, error) {
	signer, err := pemblock.ParseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	switch signer.(type) {
	case *ecdsa.PrivateKey, *rsa.PrivateKey:
	default:
		return nil, fmt.Errorf("key: %T is not an ECDSA or RSA key", signer)
	}
	return signer, nil
}

// createRoot makes a self-signed root and writes it, key first and
// owner-only, each file by rename so that a crash leaves no torn file.
func createRoot(cfg Config, now time.Time) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ca root: generate key: %w", err)
	}
	tmpl := &x509.Certificate{
		// No SerialNumber: CreateCertificate makes a random one (RFC 5280).
		// Istio's self-signed root names the trust domain as organisation.
		Subject:               pkix.Name{Organization: []string{cfg.TrustDomain}, CommonName: "meshagent standalone root CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(rootLifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("ca root: self-sign: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("ca root: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("ca root: encode key: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.MkdirAll(cfg.RootDir, 0o755); err != nil {
		return nil, fmt.Errorf("ca root: %w", err)
	}
	if err := atomicfile.Write(cfg.RootKeyPath(), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, fmt.Errorf("ca root: %w", err)
	}
	if err := atomicfile.Write(cfg.RootCertPath(), certPEM, 0o644); err != nil {
		return nil, fmt.Errorf("ca root: %w", err)
	}
	return &authority{cert: cert, certPEM: certPEM, key: key}, nil
}

// servingCertificate is the CA's own TLS certificate, issued by its root for
// localhost, 127.0.0.1, ::1 and the configured names, so that a client
// that trusts root-cert.pem (the agent with CA_ROOT_CA) verifies it.
func (a *authority) servingCertificate(sans []string, now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("ca serving certificate: generate key: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "meshagent standalone CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              earlier(now.Add(servingLifetime), a.cert.NotAfter),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, san := range sans {
		if ip := net.ParseIP(san); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, san)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, key.Public(), a.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("ca serving certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der, a.cert.Raw}, PrivateKey: key}, nil
}
