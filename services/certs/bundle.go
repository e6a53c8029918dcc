package certs

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/pemblock"
)

// Errors a bundle is rejected with; wrapped with the file (or CA) and detail.
var (
	ErrNoCertificate = errors.New("no PEM certificate found")
	ErrBadKey        = pemblock.ErrBadKey
	ErrKeyMismatch   = errors.New("private key does not match the leaf certificate")
	ErrExpired       = errors.New("leaf certificate has expired")
	ErrNotYetValid   = errors.New("leaf certificate is not yet valid")
)

// bundleSources names where each part came from, for error messages.
type bundleSources struct{ chain, key, roots string }

// buildBundle checks a chain, key and roots and returns the bundle to
// publish. Errors name the source and the problem, never the key bytes.
func buildBundle(chainPEM, keyPEM, rootsPEM []byte, src bundleSources, now time.Time) (messages.CertBundle, error) {
	chain, err := parseCerts(chainPEM)
	if err != nil {
		return messages.CertBundle{}, fmt.Errorf("certificate chain %s: %w", src.chain, err)
	}
	leaf := chain[0]
	key, err := pemblock.ParseKey(keyPEM)
	if err != nil {
		return messages.CertBundle{}, fmt.Errorf("private key %s: %w", src.key, err)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(leaf.PublicKey) {
		return messages.CertBundle{}, fmt.Errorf("private key %s: %w in %s (subject %q)", src.key, ErrKeyMismatch, src.chain, leaf.Subject.String())
	}
	if now.After(leaf.NotAfter) {
		return messages.CertBundle{}, fmt.Errorf("certificate chain %s: %w (not after %s, now %s)", src.chain, ErrExpired,
			leaf.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	if now.Before(leaf.NotBefore.Add(-5 * time.Minute)) { // allow a little clock skew
		return messages.CertBundle{}, fmt.Errorf("certificate chain %s: %w (not before %s)", src.chain, ErrNotYetValid,
			leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if _, err := parseCerts(rootsPEM); err != nil {
		return messages.CertBundle{}, fmt.Errorf("root certificates %s: %w", src.roots, err)
	}
	return messages.CertBundle{
		CertChainPEM: chainPEM,
		KeyPEM:       keyPEM,
		RootsPEM:     rootsPEM,
		Expiry:       leaf.NotAfter,
		Version:      messages.ContentVersion(chainPEM, keyPEM, rootsPEM),
	}, nil
}

// withRoots is b with other trusted roots (Istio's mixed mode), under a
// version of its own.
func withRoots(b messages.CertBundle, rootsPEM []byte) messages.CertBundle {
	b.RootsPEM = rootsPEM
	b.Version = messages.ContentVersion(b.CertChainPEM, b.KeyPEM, rootsPEM)
	return b
}

// parseCerts returns every CERTIFICATE block of pemBytes, in order.
func parseCerts(pemBytes []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for der := range pemblock.Certificates(pemBytes) {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("certificate #%d does not parse: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		if len(bytes.TrimSpace(pemBytes)) == 0 {
			return nil, fmt.Errorf("%w (empty)", ErrNoCertificate)
		}
		return nil, ErrNoCertificate
	}
	return certs, nil
}
