package certs

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/pemblock"
)

// publicKeyOf is the public key of a bundle's key.
func publicKeyOf(t *testing.T, b messages.CertBundle) crypto.PublicKey {
	t.Helper()
	key, err := pemblock.ParseKey(b.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return key.Public()
}

func earlyKeyOf(t *testing.T, k *EarlyKey) crypto.Signer {
	t.Helper()
	key, err := k.wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// The key generated at the process's start (#36) is the first
// certificate's key; the renewal makes a key of its own.
func TestEarlyKeyIsTheFirstCertificatesKey(t *testing.T) {
	c := newCASetup(t, 4*time.Second)
	c.ca.Start(t)
	early := StartKey(c.cfg.KeySettings(), messages.SystemClock{})
	c.cfg.EarlyKey = early
	c.start(t)
	first := c.out.WaitLast(t, "the first certificate", func(b messages.CertBundle) bool { return b.Version != "" })
	want := earlyKeyOf(t, early).Public().(*ecdsa.PublicKey)
	if !want.Equal(publicKeyOf(t, first)) {
		t.Fatal("the first certificate's key is not the key generated at start")
	}
	c.logs.WaitLine(t, "workload key generated at start", "key_algorithm=ECDSA")
	renewed := c.out.WaitLast(t, "the renewed certificate", func(b messages.CertBundle) bool { return b.Version != "" && b.Version != first.Version })
	if want.Equal(publicKeyOf(t, renewed)) {
		t.Error("the renewal reused the key generated at start")
	}
}

// A failed early generation costs nothing but a log line: the first CSR
// generates its key as without one.
func TestEarlyKeyFailureFallsBack(t *testing.T) {
	c := newCASetup(t, time.Hour)
	c.ca.Start(t)
	c.cfg.EarlyKey = StartKey(KeySettings{Algorithm: "DSA"}, messages.SystemClock{})
	c.start(t)
	b := c.out.WaitLast(t, "a certificate", func(b messages.CertBundle) bool { return b.Version != "" })
	if pub, ok := publicKeyOf(t, b).(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("the certificate's key is %T, want ECDSA P-256 (the settings)", publicKeyOf(t, b))
	}
	c.logs.WaitLine(t, "the workload key generated at start is not used; generating one now", `key algorithm \"DSA\"`)
}

// An early key of other settings than the service's (ECC_CURVE P384 against
// P256) is not used.
func TestEarlyKeyOfOtherSettingsIsNotUsed(t *testing.T) {
	c := newCASetup(t, time.Hour)
	c.ca.Start(t)
	early := StartKey(KeySettings{Algorithm: ECDSA, Curve: "P384"}, messages.SystemClock{})
	c.cfg.EarlyKey = early
	c.start(t)
	b := c.out.WaitLast(t, "a certificate", func(b messages.CertBundle) bool { return b.Version != "" })
	pub, ok := publicKeyOf(t, b).(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Fatalf("the certificate's key is %T, want ECDSA P-256 (the settings)", publicKeyOf(t, b))
	}
	if earlyKeyOf(t, early).Public().(*ecdsa.PublicKey).Equal(pub) {
		t.Error("the early key of other settings was used")
	}
	c.logs.WaitLine(t, "the workload key generated at start is not used", "ECDSA P-384, want ECDSA P256")
}

// fits checks the key itself against each setting.
func TestFitsChecksTheKey(t *testing.T) {
	p256, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ks   KeySettings
		fits bool
	}{
		{KeySettings{Algorithm: ECDSA, Curve: "P256"}, true},
		{KeySettings{Algorithm: ECDSA, Curve: "P384"}, false},
		{KeySettings{Algorithm: RSA, RSABits: 2048}, false},
	} {
		err := fits(p256, tc.ks)
		if (err == nil) != tc.fits || err != nil && !errors.Is(err, ErrKeyNotOfSettings) {
			t.Errorf("fits(P-256 key, %+v) = %v, want fits %v", tc.ks, err, tc.fits)
		}
	}
	if err := fits(p256, KeySettings{Algorithm: RSA, RSABits: 2048}); !strings.Contains(err.Error(), "want RSA 2048 bits") {
		t.Errorf("the error does not name the settings: %v", err)
	}
}
