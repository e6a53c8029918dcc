package messages

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// ContentVersion is a hash of the content: equal content, equal version.
// It is CertBundle.Version and the version of every SDS secret, so that a
// bundle published again unchanged is not pushed to Envoy again.
func ContentVersion(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:", len(p))
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
