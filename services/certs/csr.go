package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/url"
)

// newCSR encodes the workload key and makes a CSR for the SPIFFE ID. The
// CSR carries the ID as its only URI SAN, as Istio's CA requires.
func newCSR(key crypto.Signer, cfg Config) (keyPEM, csrPEM []byte, err error) {
	keyPEM, err = encodeKey(key, cfg.PKCS8Key)
	if err != nil {
		return nil, nil, err
	}
	id, err := url.Parse(cfg.SpiffeID())
	if err != nil {
		return nil, nil, fmt.Errorf("SPIFFE ID %q: %w", cfg.SpiffeID(), err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{id}}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CSR for %s: %w", id, err)
	}
	return keyPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// generateKey makes a workload key of ks.
func generateKey(ks KeySettings) (crypto.Signer, error) {
	switch ks.Algorithm {
	case ECDSA:
		return ecdsa.GenerateKey(curveOf(ks.Curve), rand.Reader)
	case RSA:
		return rsa.GenerateKey(rand.Reader, ks.RSABits)
	}
	return nil, fmt.Errorf("key algorithm %q: want RSA or ECDSA", ks.Algorithm)
}

func encodeKey(key crypto.Signer, pkcs8 bool) ([]byte, error) {
	if pkcs8 {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, fmt.Errorf("encode PKCS#8 key: %w", err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
	}
	switch k := key.(type) {
	case *rsa.PrivateKey:
		return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), nil
	case *ecdsa.PrivateKey:
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, fmt.Errorf("encode EC key: %w", err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
	}
	return nil, fmt.Errorf("encode key: unsupported type %T", key)
}
