package certs

import (
	"path/filepath"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// Istio's certificate directories under a test root (cmd's table has the
// production spelling).
const (
	testEtcCertsDir    = "etc/certs"
	testWorkloadCreds  = "var/run/secrets/workload-spiffe-credentials"
	testCARootCertPath = "var/run/secrets/istio/root-cert.pem"
	testTokenPath      = "var/run/secrets/tokens/istio-token"
)

// testConfig is the config cmd builds by default, with every path under
// root: the env table's defaults, Istio's paths and CA address.
func testConfig(t testing.TB, root string) Config {
	cfg := NewConfig()
	testkit.FillFromTable(t, &cfg)
	cfg.Namespace, cfg.ServiceAccount = "default", "default"
	etc := filepath.Join(root, testEtcCertsDir)
	cfg.CertChainFile = filepath.Join(etc, CertChainFileName)
	cfg.KeyFile = filepath.Join(etc, KeyFileName)
	cfg.RootCertFile = filepath.Join(etc, RootCertFileName)
	cfg.CAAddr = "istiod.istio-system.svc:15012"
	cfg.CARootFile = filepath.Join(root, testCARootCertPath)
	cfg.TokenFile = filepath.Join(root, testTokenPath)
	return cfg
}

// chooseSource is ChooseSource with Istio's directories under root.
func chooseSource(cfg Config, root string, fileMountedCerts bool) Config {
	return ChooseSource(cfg, filepath.Join(root, testEtcCertsDir), filepath.Join(root, testWorkloadCreds), fileMountedCerts)
}
