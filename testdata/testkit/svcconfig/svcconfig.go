// Package svcconfig builds the services' configs as cmd builds them by
// default, their table values from the env table (testkit.TableDefault,
// #34), for the tests outside a service's own package (a service's own
// tests cannot import this package: it imports the service).
package svcconfig

import (
	"testing"
	"time"

	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/xdsproxy/wasm"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// Certs is the certs service's config with the table's defaults and the
// namespace and service account "default"; the paths and the CA address
// are the caller's.
func Certs(t testing.TB) certs.Config {
	cfg := certs.NewConfig()
	cfg.FileDebounce = testkit.TableDefault[time.Duration](t, "FILE_DEBOUNCE_DURATION")
	cfg.TrustDomain = testkit.TableDefault[string](t, "TRUST_DOMAIN")
	cfg.Namespace, cfg.ServiceAccount = "default", "default"
	cfg.SecretTTL = testkit.TableDefault[time.Duration](t, "SECRET_TTL")
	cfg.GraceRatio = testkit.TableDefault[float64](t, "SECRET_GRACE_PERIOD_RATIO")
	cfg.GraceJitter = testkit.TableDefault[float64](t, "SECRET_GRACE_PERIOD_RATIO_JITTER")
	cfg.KeyAlgorithm = certs.KeyAlgorithm(testkit.TableDefault[string](t, "ECC_SIGNATURE_ALGORITHM"))
	cfg.RSAKeySize = testkit.TableDefault[int](t, "WORKLOAD_RSA_KEY_SIZE")
	cfg.ECCCurve = testkit.TableDefault[string](t, "ECC_CURVE")
	return cfg
}

// Wasm is the Wasm fetch's config with the table's defaults and the
// modules in dir.
func Wasm(t testing.TB, dir string) wasm.Config {
	return wasm.Config{
		Dir:                   dir,
		ModuleExpiry:          testkit.TableDefault[time.Duration](t, "WASM_MODULE_EXPIRY"),
		PurgeInterval:         testkit.TableDefault[time.Duration](t, "WASM_PURGE_INTERVAL"),
		HTTPRequestTimeout:    testkit.TableDefault[time.Duration](t, "WASM_HTTP_REQUEST_TIMEOUT"),
		HTTPRequestMaxRetries: testkit.TableDefault[int](t, "WASM_HTTP_REQUEST_MAX_RETRIES"),
		MaxModuleBytes:        testkit.TableDefault[int64](t, "ISTIO_WASM_MAX_BINARY_SIZE_BYTES"),
	}
}
