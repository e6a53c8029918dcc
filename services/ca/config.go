package ca

import (
	"fmt"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/meshagent/meshagent/services/internal/loopback"
)

// stopTimeout is the CA's own tuning: its address, lifetime and trust
// domain are the caller's (MESHAGENT_CA_LISTEN, MESHAGENT_CERT_LIFETIME,
// TRUST_DOMAIN: cmd's env table holds their defaults, #34).
const stopTimeout = 5 * time.Second

// The root's files in RootDir, named as Istio names its self-signed root.
const (
	RootCertFile = "root-cert.pem"
	RootKeyFile  = "root-key.pem"
)

// Config is the CA's configuration.
type Config struct {
	// Listen is the loopback host:port the CA serves TLS on. The CA signs
	// for any caller with a token, so it is never exposed beyond the host.
	Listen string
	// RootDir holds the root certificate and key (RootCertFile,
	// RootKeyFile), generated there on first start and reused after, so
	// that certificates stay valid across restarts. Give the agent
	// CA_ROOT_CA=<RootDir>/root-cert.pem to verify the CA.
	RootDir string
	// CertLifetime is the lifetime of a workload certificate when the
	// request asks for none, and the most it may ask for (a longer request
	// is shortened to it).
	CertLifetime time.Duration
	// TrustDomain: a CSR may ask only for spiffe://<TrustDomain>/... IDs.
	TrustDomain string
	// ServingSANs are host names or IPs the CA's serving certificate holds
	// besides localhost, 127.0.0.1 and ::1.
	ServingSANs []string
	// Token, when set, is the bearer token every request must carry that
	// does not present a certificate this CA issued (see authenticate).
	// Empty accepts any non-empty bearer token (logged by fingerprint,
	// never in clear): a request without one is still refused, as Istio's
	// CA refuses an unauthenticated caller.
	Token string
	// StopTimeout bounds the graceful stop before calls are cut.
	StopTimeout time.Duration
}

// NewConfig is a CA on listen with its root under rootDir, issuing for
// lifetime in trustDomain, with the CA's own stop timeout.
func NewConfig(listen, rootDir string, lifetime time.Duration, trustDomain string) Config {
	return Config{
		Listen:       listen,
		RootDir:      rootDir,
		CertLifetime: lifetime,
		TrustDomain:  trustDomain,
		StopTimeout:  stopTimeout,
	}
}

// RootCertPath is the root certificate's file: the agent's CA_ROOT_CA.
func (c Config) RootCertPath() string { return filepath.Join(c.RootDir, RootCertFile) }

// RootKeyPath is the root key's file.
func (c Config) RootKeyPath() string { return filepath.Join(c.RootDir, RootKeyFile) }

// trustDomainSyntax is a SPIFFE trust domain: lower case letters, digits,
// dots, dashes and underscores. Compiled on first use: a sidecar runs no CA,
// and a package-level regexp is live heap in every pod (#36).
var trustDomainSyntax = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9._-]+$`) })

// Validate names the field and value that are wrong.
func (c Config) Validate() error {
	if err := loopback.Check(c.Listen); err != nil {
		return fmt.Errorf("--ca-listen (MESHAGENT_CA_LISTEN) %w", err) // #32: name what the user set
	}
	if c.RootDir == "" {
		return fmt.Errorf("ca config: RootDir is required")
	}
	if c.CertLifetime <= 0 {
		return fmt.Errorf("ca config: CertLifetime %v must be positive", c.CertLifetime)
	}
	if !trustDomainSyntax().MatchString(c.TrustDomain) {
		return fmt.Errorf("ca config: TrustDomain %q is not a SPIFFE trust domain (a-z, 0-9, '.', '-', '_')", c.TrustDomain)
	}
	for _, san := range c.ServingSANs {
		if san == "" {
			return fmt.Errorf("ca config: ServingSANs holds an empty name")
		}
	}
	if c.StopTimeout < 0 {
		return fmt.Errorf("ca config: StopTimeout %v must not be negative", c.StopTimeout)
	}
	return nil
}
