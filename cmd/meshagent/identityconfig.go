package main

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"

	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/sds"
)

// identityConfig is the certs and sds services' configs, from Istio's
// variables and paths. Both are nil with PILOT_CERT_PROVIDER=none and no
// mounted certificates: no certificate source, nothing for SDS to serve.
func identityConfig(r envReader, root string, pod podInfo, shared sharedVars, pc *meshconfig.ProxyConfig) (*certs.Config, *sds.Config) {
	cc := certs.DefaultConfig()
	provider := envVar(r, "PILOT_CERT_PROVIDER", "istiod", config.ParseString)
	switch provider {
	case "istiod", "kubernetes", "custom", "none":
	default:
		if !strings.HasPrefix(provider, "k8s.io/") {
			r.problems.addf("PILOT_CERT_PROVIDER=%s: want istiod, kubernetes, k8s.io/<signer>, custom or none", config.QuoteValue(provider))
		}
	}
	if caAddr := optionalEnvVar(r, "CA_ADDR", config.ParseString); caAddr != nil {
		cc.CAAddr = *caAddr
	} else {
		// Istio names the CA with ISTIOD_SAN only when the CA is the
		// discovery address (pilot-agent options/security.go).
		cc.CAAddr, cc.CAServerName = pc.DiscoveryAddress, shared.istiodSAN
	}
	if _, port, err := net.SplitHostPort(cc.CAAddr); err == nil && port == "15010" {
		cc.CAPlaintext = true // Istio: the CA's plaintext port
	}
	cc.CARootFile = rooted(root, caRootCertFile)
	// Istio's FindRootCAForCA: custom, then PROV_CERT's root (a VM's
	// /etc/certs/root-cert.pem, from its onboarding bundle), then the
	// Kubernetes configmap's; CA_ROOT_CA wins over them all.
	if provider == "custom" {
		cc.CARootFile = rooted(root, etcCertsDir+"/"+certs.RootCertFileName)
	} else if prov := shared.provCert; prov != "" {
		cc.CARootFile = rooted(root, prov+"/"+certs.RootCertFileName)
	}
	switch caRoot := envVar(r, "CA_ROOT_CA", "", config.ParseString); caRoot {
	case "":
	case "SYSTEM":
		cc.CARootFile, cc.CASystemRoots = "", true
	default:
		cc.CARootFile = rooted(root, caRoot)
	}
	cc.TokenFile = rooted(root, tokenFile)
	cc.FileDebounce = envVar(r, "FILE_DEBOUNCE_DURATION", cc.FileDebounce, config.ParseDuration)
	cc.ClusterID = shared.clusterID
	cc.CertSigner = envVar(r, "ISTIO_META_CERT_SIGNER", "", config.ParseString)
	cc.CAHeaders = r.env.Prefixed("CA_HEADER_")
	cc.TrustDomain = envVar(r, "TRUST_DOMAIN", cc.TrustDomain, parseTrustDomain)
	cc.Namespace = nonEmpty(pod.namespace, cc.Namespace)
	cc.ServiceAccount = nonEmpty(pod.serviceAccount, cc.ServiceAccount)
	cc.SecretTTL = envVar(r, "SECRET_TTL", cc.SecretTTL, config.ParseDuration)
	cc.GraceRatio = envVar(r, "SECRET_GRACE_PERIOD_RATIO", cc.GraceRatio, config.ParseFloat)
	cc.GraceJitter = envVar(r, "SECRET_GRACE_PERIOD_RATIO_JITTER", cc.GraceJitter, config.ParseFloat)
	cc.RSAKeySize = envVar(r, "WORKLOAD_RSA_KEY_SIZE", cc.RSAKeySize, config.ParseCount)
	if envVar(r, "ECC_SIGNATURE_ALGORITHM", "", parseKeyAlgorithm) == "ECDSA" {
		cc.KeyAlgorithm = certs.ECDSA
	}
	cc.ECCCurve = envVar(r, "ECC_CURVE", cc.ECCCurve, parseECCCurve)
	cc.PKCS8Key = envVar(r, "PKCS8_KEY", false, config.ParseBool)
	if out := shared.outputCerts; out != "" {
		cc.OutputCertsDir = rooted(root, out)
		if _, onKubernetes := r.env.Text("KUBERNETES_SERVICE_HOST"); onKubernetes {
			cc.OutputFileMode = 0o644 // Istio: readable by the app container
		}
	}
	cc = certs.ChooseSource(cc, rooted(root, etcCertsDir), rooted(root, workloadCredsDir),
		envVar(r, "FILE_MOUNTED_CERTS", false, config.ParseBool))
	if cc.Source == certs.SourceCA && provider == "none" {
		return nil, nil
	}

	sc := sds.NewConfig(rooted(root, workloadIdentityDir+"/"+workloadSocketFile))
	// A file name in the SDS socket's directory; a path is refused by
	// Validate, naming the variable, as Istio refuses it.
	sc.WorkloadIdentitySocketFile = shared.workloadSocketFile
	sc.FilesSocketPath = rooted(root, credentialFilesSocket)
	sc.FileDebounce = cc.FileDebounce
	if envVar(r, "PILOT_ENABLE_CA_CRL", true, config.ParseBool) {
		sc.CRLFile = rooted(root, caCRLFile)
	}
	if cc.Source == certs.SourceCA && sds.SocketLive(sc.EnvoySocketPath()) {
		// An external SDS server (SPIRE's agent) serves the workload
		// identity: as Istio, no CA client; our SDS serves files only.
		return nil, &sc
	}
	return &cc, &sc
}

// The parts of the SPIFFE ID (spiffe://TRUST_DOMAIN/ns/POD_NAMESPACE/sa/
// SERVICE_ACCOUNT) are checked where they are read: Istio's agent takes any
// text, so a unicode or 100 KB value went into the CSR and the CA's refusal
// came back as a retry loop (#21). The rules are SPIFFE's for the trust
// domain and Kubernetes' for the names a pod can have.
const (
	maxTrustDomain  = 255 // SPIFFE: a trust domain is at most 255 bytes
	maxDNSLabel     = 63  // Kubernetes: a namespace is a DNS-1123 label
	maxDNSSubdomain = 253 // Kubernetes: a service account is a DNS-1123 subdomain
)

var (
	trustDomainChars = regexp.MustCompile(`^[a-z0-9._-]+$`)
	dnsLabel         = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

// parseTrustDomain is a SPIFFE trust domain: lowercase letters, digits,
// dots, dashes and underscores, at most 255 bytes.
func parseTrustDomain(s string) (string, error) {
	if len(s) > maxTrustDomain || !trustDomainChars.MatchString(s) {
		return "", fmt.Errorf("want a SPIFFE trust domain: lowercase letters, digits, '.', '-' and '_', at most %d bytes", maxTrustDomain)
	}
	return s, nil
}

// parseDNSLabel is a Kubernetes namespace name: a DNS-1123 label.
func parseDNSLabel(s string) (string, error) {
	if len(s) > maxDNSLabel || !dnsLabel.MatchString(s) {
		return "", fmt.Errorf("want a Kubernetes namespace name (DNS-1123 label): lowercase letters, digits and '-', starting and ending with a letter or digit, at most %d bytes", maxDNSLabel)
	}
	return s, nil
}

// parseDNSSubdomain is a Kubernetes service account name: a DNS-1123
// subdomain, labels joined by dots.
func parseDNSSubdomain(s string) (string, error) {
	bad := len(s) > maxDNSSubdomain
	for _, label := range strings.Split(s, ".") {
		bad = bad || !dnsLabel.MatchString(label)
	}
	if bad {
		return "", fmt.Errorf("want a Kubernetes service account name (DNS-1123 subdomain): dot-separated labels of lowercase letters, digits and '-', at most %d bytes", maxDNSSubdomain)
	}
	return s, nil
}

// parseKeyAlgorithm is ECC_SIGNATURE_ALGORITHM. Istio's agent compares the
// value with "ECDSA" and makes an RSA key for anything else, so a typo
// ("ecdsa", "EC") silently gave RSA; RSA, the default, may be named.
func parseKeyAlgorithm(s string) (string, error) {
	if s != "ECDSA" && s != "RSA" {
		return "", errors.New("want ECDSA (or RSA, the default when unset); the value is case-sensitive, as in Istio")
	}
	return s, nil
}

// parseECCCurve is ECC_CURVE: Istio's two curves (it takes anything else
// for P256 without a word).
func parseECCCurve(s string) (string, error) {
	if s != "P256" && s != "P384" {
		return "", errors.New("want P256 or P384")
	}
	return s, nil
}

func nonEmpty(v, def string) string {
	if v != "" {
		return v
	}
	return def
}
