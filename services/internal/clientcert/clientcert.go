// Package clientcert is the TLS client certificate the agent presents to
// istiod (its CA and its XDS server) from a provisioning certificate's
// directory: PROV_CERT, a VM's /etc/certs, where OUTPUT_CERTS also writes
// every certificate the agent is issued.
//
// istiod authenticates a caller by its client certificate before it tries
// the token (its ClientCertAuthenticator comes first). That is how a VM
// renews once the token it was onboarded with has expired (an hour, by
// istioctl's default): without the certificate, its next renewal, or its
// next start, is refused, and the workload loses its identity.
//
// The files are read as Istio's agent reads them (pilot/pkg/grpc/tls.go,
// getTLSDialOption): at every TLS handshake, so a renewed certificate is
// presented on the next connection; none is presented, and the token
// authenticates alone, when the chain is missing, does not parse or has
// expired; a valid chain whose key does not load or match fails the
// handshake, naming the files.
package clientcert

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/services/internal/pemblock"
)

// Istio's file names in a certificate directory.
const (
	chainFileName = "cert-chain.pem"
	keyFileName   = "key.pem"
)

// ErrNoCertificate wraps why no certificate is presented: the caller
// connects with the token alone, as Istio's agent does.
var ErrNoCertificate = errors.New("no client certificate to present")

// Files are a certificate chain and its private key, PEM.
type Files struct {
	Chain, Key string
}

// InDir is dir's cert-chain.pem and key.pem, Istio's names (PROV_CERT).
func InDir(dir string) Files {
	return Files{Chain: filepath.Join(dir, chainFileName), Key: filepath.Join(dir, keyFileName)}
}

// Load reads the pair as it is at now: the certificate to present; an
// error wrapping ErrNoCertificate when there is none to present (the chain
// is missing, holds no certificate that parses, or its leaf has expired);
// any other error when the chain is usable but the pair does not load.
func (f Files) Load(now time.Time) (*tls.Certificate, error) {
	chain, err := boundedfile.Read(f.Chain, boundedfile.MaxPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCertificate, err)
	}
	leaf, err := firstCertificate(chain)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrNoCertificate, f.Chain, err)
	}
	if !now.Before(leaf.NotAfter) {
		return nil, fmt.Errorf("%w: %s expired at %s", ErrNoCertificate, f.Chain, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	key, err := boundedfile.Read(f.Key, boundedfile.MaxPEM)
	if err != nil {
		return nil, fmt.Errorf("client certificate %s: its key: %w", f.Chain, err)
	}
	c, err := tls.X509KeyPair(chain, key)
	if err != nil {
		return nil, fmt.Errorf("client certificate %s with key %s: %w", f.Chain, f.Key, err)
	}
	return &c, nil
}

func firstCertificate(chain []byte) (*x509.Certificate, error) {
	for der := range pemblock.Certificates(chain) {
		return x509.ParseCertificate(der)
	}
	return nil, errors.New("no PEM certificate")
}

// GetClientCertificate is a tls.Config.GetClientCertificate that presents
// f, loaded at each handshake at now(). When there is none to present it
// logs why, naming peer ("the CA", "the control plane"), and presents
// none: at info while the chain does not exist yet (a VM's first start,
// before its first certificate is written), else as a warning.
func (f Files) GetClientCertificate(now func() time.Time, log *slog.Logger, peer string) func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		c, err := f.Load(now())
		switch {
		case err == nil:
			return c, nil
		case errors.Is(err, ErrNoCertificate) && errors.Is(err, fs.ErrNotExist):
			log.Info("no provisioning certificate yet: authenticating to "+peer+" with the token alone", "chain", f.Chain)
			return &tls.Certificate{}, nil
		case errors.Is(err, ErrNoCertificate):
			log.Warn("provisioning certificate not usable: authenticating to "+peer+" with the token alone", "error", err)
			return &tls.Certificate{}, nil
		}
		return nil, err
	}
}
