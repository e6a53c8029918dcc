// Package standalone checks the embedded peers of `meshagent standalone`
// against the agent's own clients, which the peers' packages cannot import
// (a service package never imports another). Like everything under
// testdata it is outside ./...: run it with `go test ./testdata/standalone`.
package standalone

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/services/certs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const waitFor = 30 * time.Second

// run serves svc until the test ends and checks it stops when told.
func run(t *testing.T, name string, svc interface{ Serve(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s: Serve returned %v, want context.Canceled", name, err)
			}
		case <-time.After(waitFor):
			t.Errorf("%s: Serve did not return after cancel", name)
		}
	})
}

// The agent's real CA client (services/certs, as CA_ADDR, CA_ROOT_CA and a
// token file configure it) gets its workload certificate from the embedded
// CA, and rotates it well within the certificate's short lifetime.
func TestAgentCAClientGetsAndRotatesItsCertificate(t *testing.T) {
	dir := t.TempDir()
	caHealth := messages.NewCell[messages.Health]()
	caCfg := ca.DefaultConfig(filepath.Join(dir, "ca"))
	caCfg.Listen = "127.0.0.1:0"
	caCfg.CertLifetime = 4 * time.Second // the sample uses 1m; 4s keeps the test short
	caSvc, err := ca.New(caCfg, messages.NewRuntime(ca.Name, caHealth, nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	run(t, "ca", caSvc)
	waitReady(t, caHealth)

	token := filepath.Join(dir, "istio-token")
	if err := os.WriteFile(token, []byte("a-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	certsCfg := certs.DefaultConfig()
	certsCfg.Source = certs.SourceCA
	certsCfg.CAAddr = caSvc.Addr() // 127.0.0.1:<port>: the serving certificate has that IP
	certsCfg.CARootFile = caCfg.RootCertPath()
	certsCfg.TokenFile = token
	certsCfg.KeyAlgorithm = certs.ECDSA // RSA works too, but is slow under -race
	bundles := messages.NewCell[messages.CertBundle]()
	certsSvc, err := certs.New(certsCfg, bundles, messages.NewRuntime(certs.Name, messages.NewCell[messages.Health](), nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	run(t, "certs", certsSvc)

	first := nextBundle(t, bundles, "")
	leaf := leafOf(t, first)
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != certsCfg.SpiffeID() {
		t.Errorf("leaf URIs %v, want %s", leaf.URIs, certsCfg.SpiffeID())
	}
	if got := leaf.NotAfter.Sub(leaf.NotBefore); got > 5*time.Second {
		t.Errorf("leaf lives %v: the agent's 24h request was not shortened to CertLifetime", got)
	}
	second := nextBundle(t, bundles, first.Version)
	if !leafOf(t, second).NotAfter.After(leaf.NotAfter) {
		t.Errorf("rotated certificate expires at %v, not after the first's %v", leafOf(t, second).NotAfter, leaf.NotAfter)
	}
	if string(second.RootsPEM) != string(first.RootsPEM) {
		t.Error("the root changed with the rotation")
	}
}

func waitReady(t *testing.T, health *messages.Cell[messages.Health]) {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		h, ok, changed := health.Watch()
		if ok && h.State == messages.Ready {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("never ready; last %+v", h)
		}
	}
}

// nextBundle waits for a bundle whose version is not after.
func nextBundle(t *testing.T, bundles *messages.Cell[messages.CertBundle], after string) messages.CertBundle {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		b, ok, changed := bundles.Watch()
		if ok && b.Version != after {
			return b
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no certificate after version %q", after)
		}
	}
}

func leafOf(t *testing.T, b messages.CertBundle) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(b.CertChainPEM)
	if block == nil {
		t.Fatal("bundle has no PEM chain")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
