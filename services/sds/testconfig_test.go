package sds

import "path/filepath"

// Istio's paths under a test root (cmd's table has the production spelling).
const (
	testSocketPath         = "var/run/secrets/workload-spiffe-uds/socket"
	testWorkloadSocketFile = "socket"
	testFilesSocketPath    = "var/run/secrets/credential-uds/files-socket"
	testCRLPath            = "var/run/secrets/istio/crl/ca-crl.pem"
)

// testConfig is the config cmd builds by default, with every path under root.
func testConfig(root string) Config {
	cfg := NewConfig(filepath.Join(root, testSocketPath))
	cfg.WorkloadIdentitySocketFile = testWorkloadSocketFile
	cfg.FilesSocketPath = filepath.Join(root, testFilesSocketPath)
	cfg.CRLFile = filepath.Join(root, testCRLPath)
	return cfg
}
