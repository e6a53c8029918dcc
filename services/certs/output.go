package certs

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/atomicfile"
)

// writeOutput writes the bundle to OUTPUT_CERTS (if set) when its version
// differs from what was last written. A failure is logged, not fatal: the
// bundle is still served over SDS.
func (s *Service) writeOutput(b messages.CertBundle) {
	if s.cfg.OutputCertsDir == "" || s.written == b.Version {
		return
	}
	if err := writeBundleFiles(s.cfg.OutputCertsDir, b, s.cfg.OutputFileMode); err != nil {
		s.log.Error("writing OUTPUT_CERTS", "dir", s.cfg.OutputCertsDir, "error", err)
		return
	}
	s.written = b.Version
}

// writeBundleFiles writes key.pem, cert-chain.pem and root-cert.pem into dir,
// each atomically (temp file in the same directory, fsync, rename).
func writeBundleFiles(dir string, b messages.CertBundle, mode os.FileMode) error {
	if mode == 0 {
		mode = 0o600
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{KeyFileName, b.KeyPEM}, {CertChainFileName, b.CertChainPEM}, {RootCertFileName, b.RootsPEM}} {
		if err := atomicfile.Write(filepath.Join(dir, f.name), f.data, mode); err != nil {
			return err
		}
	}
	return nil
}
