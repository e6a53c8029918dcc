package sds

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// Istio's paths under a test root (cmd's table has the production spelling).
const (
	testSocketPath      = "var/run/secrets/workload-spiffe-uds/socket"
	testFilesSocketPath = "var/run/secrets/credential-uds/files-socket"
	testCRLPath         = "var/run/secrets/istio/crl/ca-crl.pem"
)

// testConfig is the config cmd builds by default, with every path under root.
func testConfig(t testing.TB, root string) Config {
	cfg := NewConfig(filepath.Join(root, testSocketPath), testkit.TableDefault[time.Duration](t, "FILE_DEBOUNCE_DURATION"))
	cfg.WorkloadIdentitySocketFile = testkit.TableDefault[string](t, "WORKLOAD_IDENTITY_SOCKET_FILE")
	cfg.FilesSocketPath = filepath.Join(root, testFilesSocketPath)
	cfg.CRLFile = filepath.Join(root, testCRLPath)
	return cfg
}
