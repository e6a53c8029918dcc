package certs

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/messages"
)

// ErrKeyNotOfSettings: a key generated ahead of the service is not of the
// settings the service runs with.
var ErrKeyNotOfSettings = errors.New("the key is not of the key settings")

// KeySettings are the workload key's settings: Config's KeyAlgorithm
// (ECC_SIGNATURE_ALGORITHM), RSAKeySize (WORKLOAD_RSA_KEY_SIZE) and
// ECCCurve (ECC_CURVE).
type KeySettings struct {
	Algorithm KeyAlgorithm
	RSABits   int
	Curve     string
}

// KeySettings are cfg's key settings.
func (c Config) KeySettings() KeySettings {
	return KeySettings{Algorithm: c.KeyAlgorithm, RSABits: c.RSAKeySize, Curve: c.ECCCurve}
}

// EarlyKey is a workload key being generated ahead of the service (#36):
// cmd starts it at the process's first instruction, so that an RSA key
// (Istio's default: ~80 ms of CPU idle, several times that in a start storm)
// is made while the configuration is parsed, the tree built and Envoy
// started, rather than after them, on the certificate's path to readiness.
// The service stays the key's one owner: it takes the key for its first
// CSR if it fits its settings, else makes its own as before. The
// generating goroutine writes the result once, before closing done.
type EarlyKey struct {
	Settings KeySettings
	done     chan struct{}
	key      crypto.Signer
	err      error
	began    time.Time
	took     time.Duration
}

// StartKey starts generating a key of ks on a goroutine of its own, and
// returns at once.
func StartKey(ks KeySettings, clock messages.Clock) *EarlyKey {
	k := &EarlyKey{Settings: ks, done: make(chan struct{}), began: clock.Now()}
	go func() {
		defer close(k.done)
		k.key, k.err = generateKey(ks)
		k.took = clock.Now().Sub(k.began)
	}()
	return k
}

// wait returns the key once generated, or ctx's error.
func (k *EarlyKey) wait(ctx context.Context) (crypto.Signer, error) {
	select {
	case <-k.done:
		return k.key, k.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// fits says why key is not a key of ks (nil if it is): the key itself is
// checked, not the settings it was asked with.
func fits(key crypto.Signer, ks KeySettings) error {
	want := string(ks.Algorithm)
	switch k := key.(type) {
	case *rsa.PrivateKey:
		if ks.Algorithm == RSA && k.N.BitLen() == ks.RSABits {
			return nil
		}
		return fmt.Errorf("%w: RSA %d bits, want %s", ErrKeyNotOfSettings, k.N.BitLen(), want+settingsDetail(ks))
	case *ecdsa.PrivateKey:
		if ks.Algorithm == ECDSA && k.Curve == curveOf(ks.Curve) {
			return nil
		}
		return fmt.Errorf("%w: ECDSA %s, want %s", ErrKeyNotOfSettings, k.Curve.Params().Name, want+settingsDetail(ks))
	}
	return fmt.Errorf("%w: %T, want %s", ErrKeyNotOfSettings, key, want+settingsDetail(ks))
}

func settingsDetail(ks KeySettings) string {
	if ks.Algorithm == ECDSA {
		return " " + ks.Curve
	}
	return fmt.Sprintf(" %d bits", ks.RSABits)
}

// curveOf is ECC_CURVE's curve: P384, else P256 (Validate allows no other).
func curveOf(name string) elliptic.Curve {
	if name == "P384" {
		return elliptic.P384()
	}
	return elliptic.P256()
}

// workloadKey is the key for the next CSR: the early key, for the first CSR
// only, when it was generated and fits the settings; otherwise a new one,
// as without an early key. Serve's goroutine only.
func (s *Service) workloadKey(ctx context.Context) (crypto.Signer, error) {
	if k := s.early; k != nil {
		s.early = nil
		waitFrom := s.clock.Now()
		key, err := k.wait(ctx)
		if err == nil {
			err = fits(key, s.cfg.KeySettings())
		}
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			s.log.Warn("the workload key generated at start is not used; generating one now", "error", err)
		default:
			// Where a start's key time goes (#36): generated from the
			// process's start, and how long the first CSR waited for it.
			s.log.Debug("workload key generated at start", "key_algorithm", k.Settings.Algorithm,
				"generated_in", k.took.Round(time.Microsecond), "waited", s.clock.Now().Sub(waitFrom).Round(time.Microsecond))
			return key, nil
		}
	}
	return generateKey(s.cfg.KeySettings())
}
