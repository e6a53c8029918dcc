package config

import (
	"net"
	"strings"

	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/sds"
)

// identityConfig is the certs and sds services' configs, from Istio's
// variables and paths. Both are nil with PILOT_CERT_PROVIDER=none and no
// mounted certificates: no certificate source, nothing for SDS to serve.
func identityConfig(r envReader, host Host, root string, pod podInfo, shared sharedVars, pc *meshconfig.ProxyConfig) (*certs.Config, *sds.Config) {
	cc := certs.DefaultConfig()
	provider := envVar(r, "PILOT_CERT_PROVIDER", "istiod", ParseString)
	switch provider {
	case "istiod", "kubernetes", "custom", "none":
	default:
		if !strings.HasPrefix(provider, "k8s.io/") {
			r.problems.Addf("PILOT_CERT_PROVIDER=%s: want istiod, kubernetes, k8s.io/<signer>, custom or none", QuoteValue(provider))
		}
	}
	if caAddr := optionalEnvVar(r, "CA_ADDR", ParseString); caAddr != nil {
		cc.CAAddr = *caAddr
	} else {
		// Istio names the CA with ISTIOD_SAN only when the CA is the
		// discovery address (pilot-agent options/security.go).
		cc.CAAddr, cc.CAServerName = pc.DiscoveryAddress, shared.istiodSAN
	}
	if _, port, err := net.SplitHostPort(cc.CAAddr); err == nil && port == "15010" {
		cc.CAPlaintext = true // Istio: the CA's plaintext port
	}
	cc.CARootFile = Rooted(root, caRootCertFile)
	// Istio's FindRootCAForCA: custom, then PROV_CERT's root (a VM's
	// /etc/certs/root-cert.pem, from its onboarding bundle), then the
	// Kubernetes configmap's; CA_ROOT_CA wins over them all.
	if provider == "custom" {
		cc.CARootFile = Rooted(root, etcCertsDir+"/"+certs.RootCertFileName)
	} else if prov := shared.provCert; prov != "" {
		cc.CARootFile = Rooted(root, prov+"/"+certs.RootCertFileName)
	}
	switch caRoot := envVar(r, "CA_ROOT_CA", "", ParseString); caRoot {
	case "":
	case "SYSTEM":
		cc.CARootFile, cc.CASystemRoots = "", true
	default:
		cc.CARootFile = Rooted(root, caRoot)
	}
	cc.TokenFile = Rooted(root, TokenFile)
	if prov := shared.provCert; prov != "" {
		cc.ProvCertDir = Rooted(root, prov) // Istio's GetKeyCertsForCA
	}
	cc.FileDebounce = envVar(r, "FILE_DEBOUNCE_DURATION", cc.FileDebounce, ParseDuration)
	cc.ClusterID = shared.clusterID
	cc.CompliancePolicy = shared.compliancePolicy
	cc.CertSigner = envVar(r, "ISTIO_META_CERT_SIGNER", "", ParseString)
	cc.CAHeaders = r.env.Prefixed("CA_HEADER_")
	cc.TrustDomain = envVar(r, "TRUST_DOMAIN", cc.TrustDomain, ParseTrustDomain)
	cc.Namespace = nonEmpty(pod.namespace, cc.Namespace)
	cc.ServiceAccount = nonEmpty(pod.serviceAccount, cc.ServiceAccount)
	cc.SecretTTL = envVar(r, "SECRET_TTL", cc.SecretTTL, ParseDuration)
	cc.GraceRatio = envVar(r, "SECRET_GRACE_PERIOD_RATIO", cc.GraceRatio, ParseFloat)
	cc.GraceJitter = envVar(r, "SECRET_GRACE_PERIOD_RATIO_JITTER", cc.GraceJitter, ParseFloat)
	cc.RSAKeySize = envVar(r, "WORKLOAD_RSA_KEY_SIZE", cc.RSAKeySize, ParseCount)
	if envVar(r, "ECC_SIGNATURE_ALGORITHM", "", ParseKeyAlgorithm) == "ECDSA" {
		cc.KeyAlgorithm = certs.ECDSA
	}
	cc.ECCCurve = envVar(r, "ECC_CURVE", cc.ECCCurve, ParseECCCurve)
	cc.PKCS8Key = envVar(r, "PKCS8_KEY", false, ParseBool)
	if out := shared.outputCerts; out != "" {
		cc.OutputCertsDir = Rooted(root, out)
		if _, onKubernetes := r.env.Text("KUBERNETES_SERVICE_HOST"); onKubernetes {
			cc.OutputFileMode = 0o644 // Istio: readable by the app container
		}
	}
	cc = certs.ChooseSource(cc, Rooted(root, etcCertsDir), Rooted(root, workloadCredsDir),
		envVar(r, "FILE_MOUNTED_CERTS", false, ParseBool))
	if cc.Source == certs.SourceCA && provider == "none" {
		return nil, nil
	}

	sc := sds.NewConfig(Rooted(root, workloadIdentityDir+"/"+workloadSocketFile))
	// A file name in the SDS socket's directory; a path is refused by
	// Validate, naming the variable, as Istio refuses it.
	sc.WorkloadIdentitySocketFile = shared.workloadSocketFile
	sc.FilesSocketPath = Rooted(root, credentialFilesSocket)
	sc.FileDebounce = cc.FileDebounce
	if envVar(r, "PILOT_ENABLE_CA_CRL", true, ParseBool) {
		sc.CRLFile = Rooted(root, caCRLFile)
	}
	if cc.Source == certs.SourceCA && host.socketLive(sc.EnvoySocketPath()) {
		// An external SDS server (SPIRE's agent) serves the workload
		// identity: as Istio, no CA client; our SDS serves files only.
		return nil, &sc
	}
	return &cc, &sc
}

func nonEmpty(v, def string) string {
	if v != "" {
		return v
	}
	return def
}
