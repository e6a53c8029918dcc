package certs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshagent/meshagent/messages/compliance"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
)

// Source is where the workload certificate comes from.
type Source int

const (
	// SourceCA: generate a key, send a CSR to the control plane's CA
	// (IstioCertificateService) and renew before expiry.
	SourceCA Source = iota
	// SourceFiles: read PEM files mounted into the pod/VM and follow
	// their changes.
	SourceFiles
)

func (s Source) String() string {
	if s == SourceFiles {
		return "files"
	}
	return "ca"
}

// MeshRootsSource is where the mesh's trusted roots (SDS "ROOTCA", what
// Envoy verifies peers with) come from when that is not where the
// certificate comes from: Istio's mixed mode, where each of the two is
// served from files if its files exist and from the CA otherwise
// (secretcache.go generateFileSecret decides "default" and "ROOTCA"
// separately). Not the XDS proxy's ControlPlaneRootsSource, the roots it
// verifies istiod with (the two were RootsSource and RootSource, #26).
type MeshRootsSource int

const (
	// RootsWithCertificate: from the certificate's Source (the CA's
	// response, or RootCertFile). The zero value.
	RootsWithCertificate MeshRootsSource = iota
	// RootsFromFile: from RootCertFile, followed like the file-mounted
	// certificates, while the certificate comes from the CA
	// (<root>/etc/certs/root-cert.pem exists, cert-chain.pem does not).
	RootsFromFile
	// RootsFromCA: from the CA's response (a CSR is made for them, as
	// Istio does, and renewed like a certificate), while the certificate
	// comes from CertChainFile and KeyFile (<root>/etc/certs/cert-chain.pem
	// and key.pem exist, root-cert.pem does not).
	RootsFromCA
)

func (r MeshRootsSource) String() string {
	switch r {
	case RootsFromFile:
		return "file"
	case RootsFromCA:
		return "ca"
	}
	return "with the certificate"
}

// The file names of a certificate directory (Istio's), and the CA
// client's own tuning, which no variable sets. What a variable sets
// (TRUST_DOMAIN, SECRET_TTL, ...) has its default in cmd's env table
// alone (#34): here it is a required field of Config.
const (
	CertChainFileName = "cert-chain.pem"
	KeyFileName       = "key.pem"
	RootCertFileName  = "root-cert.pem"
	retryInitial      = 200 * time.Millisecond
	retryMax          = 30 * time.Second
	requestTimeout    = 10 * time.Second
)

// KeyAlgorithm is the workload key type for CSRs.
type KeyAlgorithm string

const (
	RSA   KeyAlgorithm = "RSA"   // WORKLOAD_RSA_KEY_SIZE bits (Istio's default)
	ECDSA KeyAlgorithm = "ECDSA" // ECC_SIGNATURE_ALGORITHM=ECDSA, curve ECC_CURVE
)

// Config is everything the certs service needs, as plain values. cmd fills it
// from Istio's environment variables (named on each field), every one of
// them: NewConfig gives only the client's own tuning, ChooseSource Istio's
// choice of source. A field tagged env:"NAME" takes that variable's value
// (the test kit fills it from the table: testkit.FillFromTable).
type Config struct {
	// Source selects files or the CA for the certificate (see
	// ChooseSource).
	Source Source
	// Roots: where the trusted roots come from when not from Source
	// (Istio's mixed mode, see MeshRootsSource and ChooseSource).
	Roots MeshRootsSource

	// --- file-mounted certificates ---

	// CertChainFile, KeyFile, RootCertFile: absolute paths of the PEM files
	// (Istio: <root>/etc/certs/{cert-chain,key,root-cert}.pem, or
	// <root>/var/run/secrets/workload-spiffe-credentials/...).
	CertChainFile string
	KeyFile       string
	RootCertFile  string
	// FileDebounce: quiet time after the last change before re-reading
	// (FILE_DEBOUNCE_DURATION; 0: none).
	FileDebounce time.Duration `env:"FILE_DEBOUNCE_DURATION"`

	// --- CA client ---

	// CAAddr: host:port of IstioCertificateService (CA_ADDR; default the
	// discovery address istiod.istio-system.svc:15012).
	CAAddr string
	// CAServerName: the name checked in the CA's certificate (ISTIOD_SAN
	// when CA_ADDR is unset, as Istio's agent takes it); empty: the host of
	// CAAddr, localhost meaning istiod.istio-system.svc.
	CAServerName string
	// CARootFile: PEM roots that verify the CA's TLS certificate (CA_ROOT_CA,
	// default <root>/var/run/secrets/istio/root-cert.pem). Empty with
	// CASystemRoots: the OS trust store.
	CARootFile    string
	CASystemRoots bool
	// CAPlaintext: no TLS (Istio does this for a CA_ADDR on port 15010).
	CAPlaintext bool
	// CompliancePolicy (COMPLIANCE_POLICY) sets the TLS versions, suites
	// and curves of the connection to the CA, as Istio's
	// EnforceGoCompliance does to its CA client (#35).
	CompliancePolicy compliance.Policy
	// TokenFile: JWT sent as "authorization: Bearer <token>", read fresh on
	// every call; a missing file sends no header
	// (<root>/var/run/secrets/tokens/istio-token).
	TokenFile string
	// ProvCertDir: a provisioning certificate's directory (PROV_CERT; a
	// VM's /etc/certs, where OutputCertsDir writes each certificate
	// issued). Its cert-chain.pem and key.pem are the client certificate
	// of every TLS connection to the CA, read at each handshake, so that
	// the CA authenticates the workload by them once the token has
	// expired; a missing or expired chain presents none (the token alone,
	// as Istio). Empty: no client certificate.
	ProvCertDir string
	// ClusterID: sent as the "ClusterID" request header (ISTIO_META_CLUSTER_ID).
	ClusterID string
	// CAHeaders: extra request headers (CA_HEADER_<NAME>=<value> ⇒ NAME: value).
	CAHeaders map[string]string
	// CertSigner: request metadata CertSigner (ISTIO_META_CERT_SIGNER).
	CertSigner string
	// TrustDomain, Namespace, ServiceAccount make the SPIFFE ID
	// spiffe://<TRUST_DOMAIN>/ns/<POD_NAMESPACE>/sa/<SERVICE_ACCOUNT>.
	TrustDomain    string `env:"TRUST_DOMAIN"`
	Namespace      string
	ServiceAccount string
	// SecretTTL: requested certificate lifetime (SECRET_TTL).
	SecretTTL time.Duration `env:"SECRET_TTL"`
	// GraceRatio: renew when this fraction of the lifetime remains
	// (SECRET_GRACE_PERIOD_RATIO), ± GraceJitter
	// (SECRET_GRACE_PERIOD_RATIO_JITTER).
	GraceRatio  float64 `env:"SECRET_GRACE_PERIOD_RATIO"`
	GraceJitter float64 `env:"SECRET_GRACE_PERIOD_RATIO_JITTER"`
	// KeyAlgorithm: RSA or ECDSA (ECC_SIGNATURE_ALGORITHM).
	KeyAlgorithm KeyAlgorithm `env:"ECC_SIGNATURE_ALGORITHM"`
	// RSAKeySize: WORKLOAD_RSA_KEY_SIZE, at least 2048.
	RSAKeySize int `env:"WORKLOAD_RSA_KEY_SIZE"`
	// ECCCurve: "P256" or "P384" (ECC_CURVE).
	ECCCurve string `env:"ECC_CURVE"`
	// PKCS8Key: encode the private key as PKCS#8 (PKCS8_KEY); otherwise
	// PKCS#1 (RSA) or SEC 1 (EC).
	PKCS8Key bool `env:"PKCS8_KEY"`
	// EarlyKey, when set, is a key of the settings above being generated
	// since the process started (StartKey, #36): the first CSR uses it if
	// it fits them. nil: the first CSR generates its key.
	EarlyKey *EarlyKey
	// RetryInitial, RetryMax: exponential backoff (with ±20% jitter) between
	// failed CA calls.
	RetryInitial time.Duration
	RetryMax     time.Duration
	// RequestTimeout bounds one CreateCertificate call.
	RequestTimeout time.Duration

	// --- both ---

	// OutputCertsDir: when set, write key.pem, cert-chain.pem, root-cert.pem
	// there atomically whenever they change (OUTPUT_CERTS).
	OutputCertsDir string
	// OutputFileMode: mode of those files (0600; Istio uses 0644 when
	// KUBERNETES_SERVICE_HOST is set).
	OutputFileMode os.FileMode
}

// NewConfig is a config with the client's own tuning (retries, the
// request timeout, output files 0600); the caller sets the rest, every
// variable's value from the env table included (#34).
func NewConfig() Config {
	return Config{
		Source:         SourceCA,
		RetryInitial:   retryInitial,
		RetryMax:       retryMax,
		RequestTimeout: requestTimeout,
		OutputFileMode: 0o600,
	}
}

// ChooseSource applies Istio's rules to cfg and returns it with Source,
// Roots and the file paths set. etcCerts and workloadCredentials are Istio's
// two certificate directories (./etc/certs and
// ./var/run/secrets/workload-spiffe-credentials, under the agent's root).
// Istio looks at the files on every request; this looks once, at start:
//
//  1. workloadCredentials/{cert-chain,key,root-cert}.pem all exist ⇒ files from there, no CA (agent.go
//     initSdsServer points the file paths there, which wins over
//     etc/certs);
//  2. in etcCerts (unless that directory is OUTPUT_CERTS, which
//     would be a loop), each part by its own files, as secretcache.go
//     generateFileSecret decides "default" and "ROOTCA" separately:
//     cert-chain.pem and key.pem not empty ⇒ the certificate from files;
//     root-cert.pem not empty ⇒ the roots from that file. One without the
//     other is Istio's mixed mode: the other part comes from the CA
//     (RootsFromCA, RootsFromFile) — except with fileMountedCerts, where
//     there is no CA and the missing files are waited for;
//  3. fileMountedCerts (FILE_MOUNTED_CERTS=true) ⇒ files from etc/certs,
//     waited for if not there yet;
//  4. otherwise the CA at CAAddr.
func ChooseSource(cfg Config, etcCerts, workloadCredentials string, fileMountedCerts bool) Config {
	etc := etcCerts
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	// Istio's keyCertificateExist and rootCertificateExist: readable and
	// not empty.
	notEmpty := func(p string) bool {
		b, err := boundedfile.Read(p, boundedfile.MaxPEM)
		return err == nil && len(b) > 0
	}
	useDir := func(dir string, roots MeshRootsSource) Config {
		cfg.Source, cfg.Roots = SourceFiles, roots
		cfg.CertChainFile = filepath.Join(dir, CertChainFileName)
		cfg.KeyFile = filepath.Join(dir, KeyFileName)
		cfg.RootCertFile = filepath.Join(dir, RootCertFileName)
		return cfg
	}
	spiffe := workloadCredentials
	if exists(filepath.Join(spiffe, CertChainFileName)) && exists(filepath.Join(spiffe, KeyFileName)) &&
		exists(filepath.Join(spiffe, RootCertFileName)) {
		return useDir(spiffe, RootsWithCertificate)
	}
	sameDir := cfg.OutputCertsDir != "" && filepath.Clean(cfg.OutputCertsDir) == filepath.Clean(etc)
	certFiles := !sameDir && notEmpty(filepath.Join(etc, CertChainFileName)) && notEmpty(filepath.Join(etc, KeyFileName))
	rootFile := !sameDir && notEmpty(filepath.Join(etc, RootCertFileName))
	switch {
	case fileMountedCerts || certFiles && rootFile:
		return useDir(etc, RootsWithCertificate)
	case certFiles:
		return useDir(etc, RootsFromCA)
	case rootFile:
		cfg.Source, cfg.Roots = SourceCA, RootsFromFile
		cfg.RootCertFile = filepath.Join(etc, RootCertFileName)
		return cfg
	}
	cfg.Source, cfg.Roots = SourceCA, RootsWithCertificate
	return cfg
}

// Validate checks cfg and names the field and value that are wrong.
func (c Config) Validate() error {
	files, ca := c.Source == SourceFiles, c.Source == SourceCA
	switch {
	case c.Source != SourceFiles && c.Source != SourceCA:
		return fmt.Errorf("certs config: Source %d is neither SourceFiles nor SourceCA", int(c.Source))
	case c.Roots == RootsFromFile && c.Source != SourceCA:
		return fmt.Errorf("certs config: Roots %v needs Source %v (the certificate from the CA), not %v", c.Roots, SourceCA, c.Source)
	case c.Roots == RootsFromCA && c.Source != SourceFiles:
		return fmt.Errorf("certs config: Roots %v needs Source %v (the certificate from files), not %v", c.Roots, SourceFiles, c.Source)
	case c.Roots < RootsWithCertificate || c.Roots > RootsFromCA:
		return fmt.Errorf("certs config: Roots %d is not a MeshRootsSource", int(c.Roots))
	}
	if files || c.Roots == RootsFromFile {
		if err := c.validateFiles(); err != nil {
			return err
		}
	}
	if ca || c.Roots == RootsFromCA {
		if err := c.validateCA(); err != nil {
			return err
		}
	}
	if c.OutputCertsDir != "" && !filepath.IsAbs(c.OutputCertsDir) {
		return fmt.Errorf("certs config: OutputCertsDir (OUTPUT_CERTS) %q must be an absolute path", c.OutputCertsDir)
	}
	if c.OutputCertsDir != "" && c.OutputFileMode&0o002 != 0 {
		return fmt.Errorf("certs config: OutputFileMode %v must not be world-writable", c.OutputFileMode)
	}
	return nil
}

// validateFiles checks what reading files needs: the certificate's files
// (SourceFiles) and the root file (unless the roots come from the CA).
func (c Config) validateFiles() error {
	type path struct{ field, value string }
	var paths []path
	if c.Source == SourceFiles {
		paths = append(paths, path{"CertChainFile", c.CertChainFile}, path{"KeyFile", c.KeyFile})
	}
	if c.Source == SourceFiles && c.Roots != RootsFromCA || c.Roots == RootsFromFile {
		paths = append(paths, path{"RootCertFile", c.RootCertFile})
	}
	for _, p := range paths {
		if p.value == "" || !filepath.IsAbs(p.value) {
			return fmt.Errorf("certs config: %s %q must be an absolute path", p.field, p.value)
		}
		if c.OutputCertsDir != "" && filepath.Clean(c.OutputCertsDir) == filepath.Dir(p.value) {
			return fmt.Errorf("certs config: OutputCertsDir (OUTPUT_CERTS) %q is the directory %s is read from: that would feed our own output back", c.OutputCertsDir, p.field)
		}
	}
	if c.FileDebounce < 0 {
		return fmt.Errorf("certs config: FileDebounce (FILE_DEBOUNCE_DURATION) %v must not be negative", c.FileDebounce)
	}
	return nil
}

// validateCA checks what asking the CA needs.
func (c Config) validateCA() error {
	if c.CAAddr == "" || !strings.Contains(c.CAAddr, ":") {
		return fmt.Errorf("certs config: CAAddr (CA_ADDR) %q must be host:port", c.CAAddr)
	}
	if !c.CAPlaintext && !c.CASystemRoots && c.CARootFile == "" {
		return fmt.Errorf("certs config: CARootFile (CA_ROOT_CA) is empty and neither CASystemRoots nor CAPlaintext is set")
	}
	if _, err := compliance.Parse(string(c.CompliancePolicy)); err != nil {
		return fmt.Errorf("certs config: CompliancePolicy (COMPLIANCE_POLICY): %w", err)
	}
	if c.TrustDomain == "" || c.Namespace == "" || c.ServiceAccount == "" {
		return fmt.Errorf("certs config: TrustDomain %q, Namespace %q and ServiceAccount %q must all be set (TRUST_DOMAIN, POD_NAMESPACE, SERVICE_ACCOUNT)",
			c.TrustDomain, c.Namespace, c.ServiceAccount)
	}
	if c.SecretTTL <= 0 {
		return fmt.Errorf("certs config: SecretTTL (SECRET_TTL) %v must be positive", c.SecretTTL)
	}
	if c.GraceRatio <= 0 || c.GraceRatio >= 1 {
		return fmt.Errorf("certs config: GraceRatio (SECRET_GRACE_PERIOD_RATIO) %v must be in (0,1)", c.GraceRatio)
	}
	if c.GraceJitter < 0 || c.GraceJitter >= c.GraceRatio || c.GraceRatio+c.GraceJitter >= 1 {
		return fmt.Errorf("certs config: GraceJitter (SECRET_GRACE_PERIOD_RATIO_JITTER) %v must be in [0, %v) and keep the ratio below 1", c.GraceJitter, c.GraceRatio)
	}
	switch c.KeyAlgorithm {
	case RSA:
		if c.RSAKeySize < 2048 {
			return fmt.Errorf("certs config: RSAKeySize (WORKLOAD_RSA_KEY_SIZE) %d must be at least 2048", c.RSAKeySize)
		}
	case ECDSA:
		if c.ECCCurve != "P256" && c.ECCCurve != "P384" {
			return fmt.Errorf("certs config: ECCCurve (ECC_CURVE) %q must be P256 or P384", c.ECCCurve)
		}
	default:
		return fmt.Errorf("certs config: KeyAlgorithm (ECC_SIGNATURE_ALGORITHM) %q must be RSA or ECDSA", c.KeyAlgorithm)
	}
	if c.RetryInitial <= 0 || c.RetryMax < c.RetryInitial {
		return fmt.Errorf("certs config: RetryInitial %v must be positive and not above RetryMax %v", c.RetryInitial, c.RetryMax)
	}
	if c.RequestTimeout <= 0 {
		return fmt.Errorf("certs config: RequestTimeout %v must be positive", c.RequestTimeout)
	}
	return nil
}

// SpiffeID is the identity the CSR asks for.
func (c Config) SpiffeID() string {
	return fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", c.TrustDomain, c.Namespace, c.ServiceAccount)
}
