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
func identityConfig(r envReader, host Host, root string, pod podInfo, pc *meshconfig.ProxyConfig) (*certs.Config, *sds.Config) {
	cc := certs.NewConfig()
	provider := get(r, envPilotCertProvider)
	switch provider {
	case "istiod", "kubernetes", "custom", "none":
	default:
		if !strings.HasPrefix(provider, "k8s.io/") {
			r.problems.addf("PILOT_CERT_PROVIDER=%s: want istiod, kubernetes, k8s.io/<signer>, custom or none", quoteValue(provider))
		}
	}
	if caAddr, ok := lookup(r, envCAAddr); ok {
		cc.CAAddr = caAddr
	} else {
		// Istio names the CA with ISTIOD_SAN only when the CA is the
		// discovery address (pilot-agent options/security.go).
		cc.CAAddr, cc.CAServerName = pc.DiscoveryAddress, get(r, envIstiodSAN)
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
	} else if prov := get(r, envProvCert); prov != "" {
		cc.CARootFile = Rooted(root, prov+"/"+certs.RootCertFileName)
	}
	switch caRoot := get(r, envCARootCA); caRoot {
	case "":
	case "SYSTEM":
		cc.CARootFile, cc.CASystemRoots = "", true
	default:
		cc.CARootFile = Rooted(root, caRoot)
	}
	cc.TokenFile = Rooted(root, TokenFile)
	if prov := get(r, envProvCert); prov != "" {
		cc.ProvCertDir = Rooted(root, prov) // Istio's GetKeyCertsForCA
	}
	cc.FileDebounce = get(r, envFileDebounceDuration)
	cc.ClusterID = get(r, envIstioMetaClusterID)
	cc.CompliancePolicy = get(r, envCompliancePolicy)
	cc.CertSigner = get(r, envIstioMetaCertSigner)
	cc.CAHeaders = r.env.prefixed(envCAHeader)
	cc.TrustDomain = get(r, envTrustDomain)
	cc.Namespace = nonEmpty(pod.namespace, unsetIdentityName)
	cc.ServiceAccount = nonEmpty(pod.serviceAccount, unsetIdentityName)
	cc.SecretTTL = get(r, envSecretTTL)
	cc.GraceRatio = get(r, envSecretGracePeriodRatio)
	cc.GraceJitter = get(r, envSecretGracePeriodRatioJitter)
	cc.RSAKeySize = get(r, envWorkloadRSAKeySize)
	cc.KeyAlgorithm = certs.KeyAlgorithm(get(r, envECCSignatureAlgorithm))
	cc.ECCCurve = get(r, envECCCurve)
	cc.PKCS8Key = get(r, envPKCS8Key)
	if out := get(r, envOutputCerts); out != "" {
		cc.OutputCertsDir = Rooted(root, out)
		if onKubernetes := get(r, envKubernetesServiceHost) != ""; onKubernetes {
			cc.OutputFileMode = 0o644 // Istio: readable by the app container
		}
	}
	cc = certs.ChooseSource(cc, Rooted(root, etcCertsDir), Rooted(root, workloadCredsDir),
		get(r, envFileMountedCerts))
	if cc.Source == certs.SourceCA && provider == "none" {
		return nil, nil
	}

	sc := sds.NewConfig(Rooted(root, workloadIdentityDir+"/"+envWorkloadIdentitySocketFile.Default), cc.FileDebounce)
	// A file name in the SDS socket's directory; a path is refused by
	// Validate, naming the variable, as Istio refuses it.
	sc.WorkloadIdentitySocketFile = get(r, envWorkloadIdentitySocketFile)
	sc.FilesSocketPath = Rooted(root, credentialFilesSocket)
	if get(r, envPilotEnableCACRL) {
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
