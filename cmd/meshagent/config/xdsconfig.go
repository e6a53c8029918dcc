package config

import (
	"cmp"
	"path/filepath"
	"strings"

	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/envoy/bootstrap"
	"github.com/meshagent/meshagent/services/xdsproxy"
	"github.com/meshagent/meshagent/services/xdsproxy/wasm"
)

// xdsInputs are what the XDS proxy's config is built from besides the
// environment.
type xdsInputs struct {
	host  Host // the probe of a mounted ./etc/certs root
	root  string
	proxy *meshconfig.ProxyConfig
	// envoyBootstrap is Envoy's bootstrap config (not the gRPC bootstrap
	// written for proxyless clients): the proxy caches what that node
	// acknowledged, and the gRPC bootstrap announces the same node.
	envoyBootstrap *bootstrap.Config
	// certs is the certificate source (nil: none): file-mounted
	// certificates give the control plane's roots and a client certificate.
	certs *certs.Config
	// nds: the DNS proxy is on and fed by the control plane (not by
	// --name-table, which wins when given).
	nds bool
	// envoyUID, envoyGID are Envoy's uid and gid when they differ from
	// the agent's (-1: same): the socket is then chowned to them.
	envoyUID, envoyGID int
}

// xdsConfig is the XDS proxy's config from Istio's ProxyConfig and
// variables (pkg/istio-agent/xds_proxy.go, agent.go): the socket Envoy's
// bootstrap names, the upstream with Istio's choice of roots, the agent's
// own types, and ours: the last-known-good cache.
func xdsConfig(r envReader, in xdsInputs) *xdsproxy.Config {
	pc := in.proxy
	c := xdsproxy.NewConfig(Rooted(in.root, filepath.Join(pc.ConfigPath, xdsSocketName)))
	if in.envoyUID >= 0 {
		c.SocketOwner.UID, c.SocketOwner.GID = in.envoyUID, in.envoyGID
	}
	c.KeepaliveInterval = get(r, envGRPCKeepaliveInterval)
	c.KeepaliveTimeout = get(r, envGRPCKeepaliveTimeout)

	c.DiscoveryAddress = pc.DiscoveryAddress
	c.Plaintext = pc.ControlPlaneAuthPolicy == meshconfig.AuthenticationPolicy_NONE
	c.Roots, c.RootCAFile = xdsRoots(r, in)
	c.ServerName = get(r, envIstiodSAN)
	c.CompliancePolicy = get(r, envCompliancePolicy)
	// Istio's GetKeyCertsForXDS: PROV_CERT's files, else the file-mounted
	// certificate.
	if prov := get(r, envProvCert); prov != "" {
		c.ProvCertDir = Rooted(in.root, prov)
	} else {
		c.ClientCertificate = in.certs != nil && in.certs.Source == certs.SourceFiles
	}
	c.TokenFile = Rooted(in.root, TokenFile)
	c.ClusterID = get(r, envIstioMetaClusterID)
	c.Headers = r.env.prefixed(envXDSHeader)

	c.NDS = in.nds
	c.ProxyConfigXDS = get(r, envProxyConfigXDSAgent)
	c.HealthUpdates = pc.GetReadinessProbe() != nil

	c.OfflineCache = get(r, envXDSOfflineCache)
	b := in.envoyBootstrap
	c.NodeID = bootstrap.NodeID(b.ProxyType, b.InstanceIPs, b.PodName, b.PodNamespace, b.Domain)
	if c.OfflineCache {
		c.CacheFile = Rooted(in.root, filepath.Join(pc.ConfigPath, xdsCacheFile))
	}

	c.Wasm = wasmConfig(r, in.root)

	c.GRPCBootstrap.Path = Rooted(in.root, get(r, envGRPCXDSBootstrap))
	node, err := b.Node()
	if err != nil {
		r.problems.addf("the node proxyless gRPC clients announce: %v", err)
	}
	c.GRPCBootstrap.Node = node
	if out := get(r, envOutputCerts); out != "" {
		// The certificate provider gRPC's xDS client reads: the files the
		// agent writes (Istio points it at OUTPUT_CERTS too).
		dir := Rooted(in.root, out)
		c.GRPCBootstrap.CertFile = filepath.Join(dir, certs.CertChainFileName)
		c.GRPCBootstrap.KeyFile = filepath.Join(dir, certs.KeyFileName)
		c.GRPCBootstrap.CAFile = filepath.Join(dir, certs.RootCertFileName)
	}
	return &c
}

// xdsRoots is where the roots verifying the control plane come from, in
// Istio's order (FindRootCAForXDS): XDS_ROOT_CA (SYSTEM: the OS's), a
// mounted ./etc/certs/root-cert.pem, PROV_CERT's root, the file-mounted
// certificates' roots, else the CA root Kubernetes mounts.
func xdsRoots(r envReader, in xdsInputs) (xdsproxy.ControlPlaneRootsSource, string) {
	switch v := get(r, envXDSRootCA); v {
	case "SYSTEM":
		return xdsproxy.RootsSystem, ""
	case "":
	default:
		return xdsproxy.RootsFile, Rooted(in.root, v)
	}
	if etcRoot := Rooted(in.root, filepath.Join(etcCertsDir, certs.RootCertFileName)); in.host.fileExists(etcRoot) {
		return xdsproxy.RootsFile, etcRoot
	}
	if prov := get(r, envProvCert); prov != "" {
		return xdsproxy.RootsFile, Rooted(in.root, filepath.Join(prov, certs.RootCertFileName))
	}
	if in.certs != nil && in.certs.Source == certs.SourceFiles {
		return xdsproxy.RootsCertBundle, ""
	}
	return xdsproxy.RootsFile, Rooted(in.root, caRootCertFile)
}

// wasmConfig is the Wasm module fetch of ECDS resources, from Istio's
// variables (pilot-agent's options.go, pilot/pkg/features): the modules
// live in Istio's data directory; the conversion off leaves Dir empty.
func wasmConfig(r envReader, root string) wasm.Config {
	var c wasm.Config
	if get(r, envWasmRemoteLoadConversion) {
		c.Dir = Rooted(root, wasmModuleDir)
	}
	if v := get(r, envWasmInsecureRegistries); v != "" {
		c.InsecureRegistries = strings.Split(v, ",")
	}
	// Istio takes 0 for its default (pkg/wasm/cache.go); the fetch
	// refuses a zero of the others, naming the variable.
	c.ModuleExpiry = cmp.Or(get(r, envWasmModuleExpiry), envWasmModuleExpiry.Default)
	c.PurgeInterval = cmp.Or(get(r, envWasmPurgeInterval), envWasmPurgeInterval.Default)
	c.HTTPRequestTimeout = get(r, envWasmHTTPRequestTimeout)
	c.HTTPRequestMaxRetries = get(r, envWasmHTTPRequestRetries)
	c.MaxModuleBytes = int64(get(r, envWasmMaxBinarySize))
	return c
}
