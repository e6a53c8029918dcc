package main

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/sds"
)

// identityConfigs builds the certs and sds configs from Istio's
// environment: PILOT_CERT_PROVIDER, CA_ADDR, CA_ROOT_CA, FILE_MOUNTED_CERTS,
// TRUST_DOMAIN, SECRET_TTL, SECRET_GRACE_PERIOD_RATIO(_JITTER),
// WORKLOAD_RSA_KEY_SIZE, ECC_SIGNATURE_ALGORITHM, ECC_CURVE, PKCS8_KEY,
// OUTPUT_CERTS, FILE_DEBOUNCE_DURATION, ISTIO_META_CLUSTER_ID,
// ISTIO_META_CERT_SIGNER, CA_HEADER_*. A nil certs config means no
// certificate source (PILOT_CERT_PROVIDER=none without mounted files).
func (c *agentConfig) identityConfigs(e *envReader) (*certs.Config, *sds.Config) {
	cc := certs.DefaultConfig(c.root)
	provider := e.str("PILOT_CERT_PROVIDER", "istiod")
	switch provider {
	case "istiod", "kubernetes", "custom", "none":
	default:
		if !strings.HasPrefix(provider, "k8s.io/") {
			e.errs = append(e.errs, fmt.Errorf("PILOT_CERT_PROVIDER=%q: want istiod, kubernetes, k8s.io/<signer>, custom or none", provider))
		}
	}
	cc.CAAddr = e.str("CA_ADDR", c.proxy.DiscoveryAddress)
	if _, port, err := net.SplitHostPort(cc.CAAddr); err == nil && port == "15010" {
		cc.CAPlaintext = true // Istio: the CA's plaintext port
	}
	if provider == "custom" {
		cc.CARootFile = filepath.Join(c.root, certs.EtcCertsDir, certs.RootCertFileName)
	}
	switch root := e.str("CA_ROOT_CA", ""); root {
	case "":
	case "SYSTEM":
		cc.CARootFile, cc.CASystemRoots = "", true
	default:
		cc.CARootFile = c.path(root)
	}
	cc.FileDebounce = e.duration("FILE_DEBOUNCE_DURATION", cc.FileDebounce)
	cc.ClusterID = e.str("ISTIO_META_CLUSTER_ID", "")
	cc.CertSigner = e.str("ISTIO_META_CERT_SIGNER", "")
	cc.CAHeaders = e.prefixed("CA_HEADER_")
	cc.TrustDomain = e.str("TRUST_DOMAIN", cc.TrustDomain)
	cc.Namespace = nonEmpty(c.pod.namespace, cc.Namespace)
	cc.ServiceAccount = nonEmpty(c.pod.serviceAccount, cc.ServiceAccount)
	cc.SecretTTL = e.duration("SECRET_TTL", cc.SecretTTL)
	cc.GraceRatio = e.float("SECRET_GRACE_PERIOD_RATIO", cc.GraceRatio)
	cc.GraceJitter = e.float("SECRET_GRACE_PERIOD_RATIO_JITTER", cc.GraceJitter)
	cc.RSAKeySize = e.integer("WORKLOAD_RSA_KEY_SIZE", cc.RSAKeySize)
	if e.str("ECC_SIGNATURE_ALGORITHM", "") == "ECDSA" {
		cc.KeyAlgorithm = certs.ECDSA
	}
	cc.ECCCurve = e.str("ECC_CURVE", cc.ECCCurve)
	cc.PKCS8Key = e.boolean("PKCS8_KEY", false)
	if out := e.str("OUTPUT_CERTS", ""); out != "" {
		cc.OutputCertsDir = c.path(out)
		if e.str("KUBERNETES_SERVICE_HOST", "") != "" {
			cc.OutputFileMode = 0o644 // Istio: readable by the app container
		}
	}
	cc = certs.ChooseSource(cc, c.root, e.boolean("FILE_MOUNTED_CERTS", false))

	sc := sds.DefaultConfig(c.root)
	if cc.Source == certs.SourceCA && provider == "none" {
		// Istio's "none": no certificates at all; SDS then has nothing to
		// serve, so neither runs.
		return nil, nil
	}
	return &cc, &sc
}

func nonEmpty(v, def string) string {
	if v != "" {
		return v
	}
	return def
}
