// Package standalone checks the embedded peers of `meshagent standalone`
// against the agent's own clients, which the peers' packages cannot import
// (a service package never imports another). Like everything under
// testdata it is outside ./...: run it with `go test ./testdata/standalone`.
package standalone

import (
	"crypto/x509"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The agent's real CA client (services/certs, as CA_ADDR, CA_ROOT_CA and a
// token file configure it) gets its workload certificate from the embedded
// CA, and rotates it well within the certificate's short lifetime.
func TestAgentCAClientGetsAndRotatesItsCertificate(t *testing.T) {
	dir := t.TempDir()
	caHealth := &testkit.HealthRecorder{}
	// the sample uses 1m; 4s keeps the test short
	caCfg := ca.NewConfig("127.0.0.1:0", filepath.Join(dir, "ca"), 4*time.Second, testkit.TableDefault[string](t, "TRUST_DOMAIN"))
	caSvc, err := ca.New(caCfg, ca.Inputs{}, ca.Outputs{}, messages.NewRuntime(ca.Name, caHealth, nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, caSvc)
	caHealth.WaitState(t, messages.Ready, "")

	token := filepath.Join(dir, "istio-token")
	testkit.WriteFile(t, token, []byte("a-token\n"))
	certsCfg := certs.NewConfig()
	testkit.FillFromTable(t, &certsCfg)
	certsCfg.Namespace, certsCfg.ServiceAccount = "default", "default"
	certsCfg.Source = certs.SourceCA
	certsCfg.CAAddr = caSvc.Addr() // 127.0.0.1:<port>: the serving certificate has that IP
	certsCfg.CARootFile = caCfg.RootCertPath()
	certsCfg.TokenFile = token
	certsCfg.KeyAlgorithm = certs.ECDSA // RSA works too, but is slow under -race
	bundles := messages.NewCell[messages.CertBundle]()
	certsSvc, err := certs.New(certsCfg, certs.Inputs{}, certs.Outputs{Certs: bundles}, messages.NewRuntime(certs.Name, messages.NewCell[messages.Health](), nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, certsSvc)

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

// nextBundle waits for a bundle whose version is not after.
func nextBundle(t *testing.T, bundles *messages.Cell[messages.CertBundle], after string) messages.CertBundle {
	t.Helper()
	return testkit.WaitValue[messages.CertBundle](t, bundles, "a certificate after version "+after, func(b messages.CertBundle) bool { return b.Version != after })
}

func leafOf(t *testing.T, b messages.CertBundle) *x509.Certificate {
	t.Helper()
	return pki.ParseLeaf(t, b.CertChainPEM)
}
