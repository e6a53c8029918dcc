package clientcert

import (
	"bytes"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// Load presents a valid pair, and says why it presents none for a chain
// that is missing, not PEM or expired (the token alone then); a usable
// chain whose key is missing or another's is an error that is not
// ErrNoCertificate (the handshake fails, naming the files).
func TestLoad(t *testing.T) {
	ca := pki.NewRoot(t, "prov root")
	chain, key := ca.Workload(t, time.Hour)
	expiredChain, expiredKey := ca.Leaf(t, pki.Leaf{SPIFFE: pki.WorkloadID, NotAfter: time.Now().Add(-time.Minute)})
	_, otherKey := ca.Workload(t, time.Hour)
	now := time.Now()
	for _, tc := range []struct {
		name       string
		chain, key []byte // nil: no file
		want       string // "" a certificate; "none" ErrNoCertificate; else an error holding it
	}{
		{"valid", chain, key, ""},
		{"no chain yet", nil, nil, "none"},
		{"not PEM", []byte("garbage\n"), key, "none"},
		{"expired", expiredChain, expiredKey, "none"},
		{"no key", chain, nil, "key.pem"},
		{"another's key", chain, otherKey, "private key does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			f := InDir(dir)
			if tc.chain != nil {
				testkit.WriteFile(t, f.Chain, tc.chain)
			}
			if tc.key != nil {
				testkit.WriteFile(t, f.Key, tc.key)
			}
			c, err := f.Load(now)
			switch tc.want {
			case "":
				if err != nil || c == nil || len(c.Certificate) == 0 {
					t.Fatalf("Load = %v, %v; want the certificate", c, err)
				}
			case "none":
				if !errors.Is(err, ErrNoCertificate) {
					t.Fatalf("Load error %v, want ErrNoCertificate", err)
				}
			default:
				if err == nil || errors.Is(err, ErrNoCertificate) {
					t.Fatalf("Load error %v, want a failure other than ErrNoCertificate", err)
				}
				testkit.Contains(t, "error", err.Error(), tc.want)
			}
		})
	}
}

// The callback reads the files at each handshake: a certificate renewed
// into the directory is the next one presented; with none it presents an
// empty certificate and logs why, at info while the chain is missing and
// as a warning when it has expired.
func TestGetClientCertificateFollowsTheFiles(t *testing.T) {
	ca := pki.NewRoot(t, "prov root")
	dir := t.TempDir()
	f := InDir(dir)
	logs := testkit.NewLogBuffer(t)
	get := f.GetClientCertificate(time.Now, logs.Logger(), "the CA")

	presented := func() *tls.Certificate {
		t.Helper()
		c, err := get(&tls.CertificateRequestInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := presented(); len(c.Certificate) != 0 {
		t.Fatal("a certificate was presented before any was written")
	}
	logs.WaitLine(t, "level=INFO", "no provisioning certificate yet", "the CA")

	first, key := ca.Workload(t, time.Hour)
	testkit.WriteFile(t, f.Key, key)
	testkit.WriteFile(t, f.Chain, first)
	if c := presented(); !isLeaf(c, pki.ParseLeaf(t, first).Raw) {
		t.Error("the written certificate is not the one presented")
	}
	renewed, renewedKey := ca.Workload(t, time.Hour)
	testkit.ReplaceFile(t, f.Key, renewedKey)
	testkit.ReplaceFile(t, f.Chain, renewed)
	if c := presented(); !isLeaf(c, pki.ParseLeaf(t, renewed).Raw) {
		t.Error("the renewed certificate is not the one presented next")
	}

	expired, expiredKey := ca.Leaf(t, pki.Leaf{SPIFFE: pki.WorkloadID, NotAfter: time.Now().Add(-time.Minute)})
	testkit.ReplaceFile(t, f.Key, expiredKey)
	testkit.ReplaceFile(t, f.Chain, expired)
	if c := presented(); len(c.Certificate) != 0 {
		t.Error("an expired certificate was presented")
	}
	logs.WaitLine(t, "level=WARN", "not usable", "expired")

	if err := os.Remove(f.Key); err != nil {
		t.Fatal(err)
	}
	testkit.ReplaceFile(t, f.Chain, renewed)
	if _, err := get(&tls.CertificateRequestInfo{}); err == nil {
		t.Error("a valid chain without its key: no error, want the handshake to fail")
	} else {
		testkit.Contains(t, "error", err.Error(), f.Key)
	}
	if filepath.Base(f.Chain) != "cert-chain.pem" || filepath.Base(f.Key) != "key.pem" {
		t.Errorf("InDir = %+v, want Istio's cert-chain.pem and key.pem", f)
	}
}

// isLeaf: c's leaf is der.
func isLeaf(c *tls.Certificate, der []byte) bool {
	return len(c.Certificate) > 0 && bytes.Equal(c.Certificate[0], der)
}
