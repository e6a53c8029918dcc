package sds

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"

	"github.com/meshagent/meshagent/services/internal/pemblock"
)

// checkAnchors returns the certificates of the extra trust anchors that
// parse, one PEM block each, and says which do not. A certificate Envoy
// cannot parse would make it reject the whole ROOTCA, and with it every
// root rotation after.
func checkAnchors(anchors [][]byte) ([][]byte, []error) {
	var out [][]byte
	var errs []error
	for i, a := range anchors {
		found := 0
		for der := range pemblock.Certificates(a) {
			found++
			if _, err := x509.ParseCertificate(der); err != nil {
				errs = append(errs, fmt.Errorf("trust anchor #%d, certificate #%d does not parse: %w", i+1, found, err))
				continue
			}
			out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
		}
		if found == 0 {
			errs = append(errs, fmt.Errorf("trust anchor #%d holds no PEM certificate", i+1))
		}
	}
	return out, errs
}

// mergeRoots is ROOTCA's trusted CAs: the mesh roots as the certs service
// published them, then each extra anchor that is not already there. Istio
// (secretcache.go mergeConfigTrustBundle) deduplicates by PEM text and sorts;
// this compares the certificates themselves, so that one certificate
// encoded twice (other line breaks, a comment before it) is still one, and
// keeps the mesh roots first.
func mergeRoots(mesh []byte, anchors [][]byte) []byte {
	if len(anchors) == 0 {
		return mesh
	}
	seen := map[string]bool{}
	for der := range pemblock.Certificates(mesh) {
		seen[string(der)] = true
	}
	out := bytes.Clone(mesh)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	for _, a := range anchors {
		block, _ := pem.Decode(a) // checkAnchors made each one block
		if block == nil || seen[string(block.Bytes)] {
			continue
		}
		seen[string(block.Bytes)] = true
		out = append(out, a...)
	}
	return out
}
