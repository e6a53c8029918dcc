package certs

import (
	"path/filepath"
	"testing"
	"time"

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
// root: the env table's defaults (as svcconfig.Certs, which this package
// cannot import), Istio's paths and CA address.
func testConfig(t testing.TB, root string) Config {
	cfg := NewConfig()
	cfg.FileDebounce = testkit.TableDefault[time.Duration](t, "FILE_DEBOUNCE_DURATION")
	cfg.TrustDomain = testkit.TableDefault[string](t, "TRUST_DOMAIN")
	cfg.Namespace, cfg.ServiceAccount = "default", "default"
	cfg.SecretTTL = testkit.TableDefault[time.Duration](t, "SECRET_TTL")
	cfg.GraceRatio = testkit.TableDefault[float64](t, "SECRET_GRACE_PERIOD_RATIO")
	cfg.GraceJitter = testkit.TableDefault[float64](t, "SECRET_GRACE_PERIOD_RATIO_JITTER")
	cfg.KeyAlgorithm = KeyAlgorithm(testkit.TableDefault[string](t, "ECC_SIGNATURE_ALGORITHM"))
	cfg.RSAKeySize = testkit.TableDefault[int](t, "WORKLOAD_RSA_KEY_SIZE")
	cfg.ECCCurve = testkit.TableDefault[string](t, "ECC_CURVE")
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
