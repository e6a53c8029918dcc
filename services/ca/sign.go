package ca

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Why a request is refused; each maps to one gRPC code (see grpcError).
var (
	// ErrBadCSR: the CSR does not parse or its signature is wrong
	// (InvalidArgument, as Istio's CSRError).
	ErrBadCSR = errors.New("bad certificate signing request")
	// ErrIdentity: the CSR asks for an identity this CA does not give
	// (PermissionDenied).
	ErrIdentity = errors.New("identity not allowed")
)

// maxBackdate is Istio's allowance for clocks that disagree
// (security/pkg/pki/util: ClockSkewGracePeriod).
const maxBackdate = 2 * time.Minute

// issued is a signed workload certificate.
type issued struct {
	pem  []byte
	cert *x509.Certificate
}

// sign checks a CSR and issues its certificate: the CSR's SPIFFE IDs as URI
// SANs (each must be in the trust domain; other SANs in the CSR are not
// copied, as Istio's CA copies none), the CSR's public key, and the
// requested lifetime shortened to maxLifetime (none requested: maxLifetime).
//
// Istio's CA refuses a request longer than its maximum instead; we shorten
// it because the agent asks for SECRET_TTL (24h by default) and the point
// of a short CertLifetime here is to see rotation without configuring the
// agent too.
func (a *authority) sign(csrPEM []byte, requested, maxLifetime time.Duration, trustDomain string, allowed []*url.URL, now time.Time) (issued, error) {
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return issued{}, fmt.Errorf("%w: no PEM CERTIFICATE REQUEST", ErrBadCSR)
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return issued{}, fmt.Errorf("%w: %v", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return issued{}, fmt.Errorf("%w: its signature does not verify: %v", ErrBadCSR, err)
	}
	if err := checkIdentities(csr.URIs, trustDomain, allowed); err != nil {
		return issued{}, err
	}

	lifetime := maxLifetime
	if requested > 0 && requested < maxLifetime {
		lifetime = requested
	}
	// Backdated for clock skew, as Istio does, but by a tenth of the
	// lifetime at most: the agent renews at a fraction of NotAfter -
	// NotBefore, and a one-minute certificate backdated by Istio's two
	// minutes would be due for renewal the moment it arrives.
	backdate := min(maxBackdate, lifetime/10)
	notAfter := earlier(now.Add(lifetime), a.cert.NotAfter)
	tmpl := &x509.Certificate{
		// No SerialNumber: CreateCertificate makes a random one (RFC 5280).
		// No Subject: the identity is the URI SAN, which x509 then marks
		// critical, as RFC 5280 requires of a subject-less certificate.
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		URIs:                  csr.URIs,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, csr.PublicKey, a.key)
	if err != nil {
		return issued{}, fmt.Errorf("sign: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return issued{}, fmt.Errorf("sign: %w", err)
	}
	return issued{pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert}, nil
}

// checkIdentities accepts one or more SPIFFE IDs, all in the trust domain,
// and each among allowed unless allowed is nil (a caller authenticated by
// its certificate asks only for the identities it holds).
func checkIdentities(uris []*url.URL, trustDomain string, allowed []*url.URL) error {
	if len(uris) == 0 {
		return fmt.Errorf("%w: the CSR has no URI SAN; want spiffe://%s/ns/<namespace>/sa/<service account>", ErrIdentity, trustDomain)
	}
	for _, u := range uris {
		if u.Scheme != "spiffe" || u.Host != trustDomain || strings.Trim(u.Path, "/") == "" ||
			u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return fmt.Errorf("%w: %q is not a SPIFFE ID in trust domain %s (want spiffe://%s/ns/<namespace>/sa/<service account>)",
				ErrIdentity, u.String(), trustDomain, trustDomain)
		}
		if allowed != nil && !slices.ContainsFunc(allowed, func(a *url.URL) bool { return a.String() == u.String() }) {
			return fmt.Errorf("%w: %q is not an identity of the client certificate the request authenticated with", ErrIdentity, u.String())
		}
	}
	return nil
}

// earlier is the earlier of two times: no certificate outlives the root.
func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
