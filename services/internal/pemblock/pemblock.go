// Package pemblock reads the PEM the agent and its standalone CA handle
// (certificate chains, roots, trust anchors, private keys) one way: the
// blocks of the wanted kind in order, any other block skipped (a comment,
// an "EC PARAMETERS" block before a key, as openssl writes it), and errors
// that describe the structure, never the key's bytes.
package pemblock

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"iter"
)

// ErrBadKey: no private key block, or one that does not parse or cannot
// sign. Wrapped with the detail.
var ErrBadKey = errors.New("not a usable PEM private key")

// Certificates yields the DER bytes of each CERTIFICATE block of b, in
// order.
func Certificates(b []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		for rest := b; ; {
			var block *pem.Block
			block, rest = pem.Decode(rest)
			if block == nil {
				return
			}
			if block.Type == "CERTIFICATE" && !yield(block.Bytes) {
				return
			}
		}
	}
}

// ParseKey returns the first private key of b: PKCS#8, PKCS#1 (RSA) or
// SEC 1 (EC).
func ParseKey(b []byte) (crypto.Signer, error) {
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("%w: no PRIVATE KEY block", ErrBadKey)
		}
		var key any
		var err error
		switch block.Type {
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		default:
			continue
		}
		if err != nil {
			// x509's parse errors describe the structure, not the bytes.
			return nil, fmt.Errorf("%w: %s block does not parse: %v", ErrBadKey, block.Type, err)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%w: unsupported key type %T", ErrBadKey, key)
		}
		return signer, nil
	}
}
