package pemblock

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"slices"
	"testing"
)

func block(typ string, b []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}) }

// Certificates yields the CERTIFICATE blocks in order and nothing else.
func TestCertificatesSkipsOtherBlocks(t *testing.T) {
	in := slices.Concat([]byte("a comment\n"), block("CERTIFICATE", []byte{1}), block("PRIVATE KEY", []byte{2}),
		block("CERTIFICATE", []byte{3}))
	var got [][]byte
	for der := range Certificates(in) {
		got = append(got, der)
	}
	if len(got) != 2 || !bytes.Equal(got[0], []byte{1}) || !bytes.Equal(got[1], []byte{3}) {
		t.Errorf("Certificates = %v, want [[1] [3]]", got)
	}
}

// ParseKey reads the three encodings, after a block that is not a key (as
// openssl writes EC PARAMETERS first); a bad key is ErrBadKey.
func TestParseKey(t *testing.T) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(ec)
	sec1, _ := x509.MarshalECPrivateKey(ec)
	for name, in := range map[string][]byte{
		"PKCS#8":               block("PRIVATE KEY", pkcs8),
		"SEC 1 after params":   slices.Concat(block("EC PARAMETERS", []byte{6, 8}), block("EC PRIVATE KEY", sec1)),
		"PKCS#1 after a chain": slices.Concat(block("CERTIFICATE", []byte{1}), block("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey))),
	} {
		if _, err := ParseKey(in); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, in := range map[string][]byte{
		"no key":         block("CERTIFICATE", []byte{1}),
		"does not parse": block("PRIVATE KEY", []byte{0x30, 0x03, 1, 2, 3}),
	} {
		if _, err := ParseKey(in); !errors.Is(err, ErrBadKey) {
			t.Errorf("%s: ParseKey = %v, want ErrBadKey", name, err)
		}
	}
}
