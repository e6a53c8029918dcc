// Package istioca runs the agent's own Istio CA (services/ca, the CA of
// `meshagent standalone`) for a test that needs an IstioCertificateService:
// the agent's CA client is then tested against a CA that behaves as a real
// one does, not against a stand-in written for the test.
//
// It is a package of its own, not part of testkit, because it imports
// services/ca: services/ca's own tests use testkit, and must not import
// themselves.
package istioca

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// Options configure a CA.
type Options struct {
	// Lifetime is the certificates' lifetime (the CA's CertLifetime: a
	// longer request is shortened to it); zero is an hour.
	Lifetime time.Duration
	// Token is the bearer token the CA wants of a caller without a
	// certificate it issued; empty accepts any.
	Token string
}

// CA is a services/ca for a test, on a loopback address of its own.
type CA struct {
	// Addr is where the CA serves, the same across Stop and Start (the
	// agent's CA_ADDR; its serving certificate holds 127.0.0.1).
	Addr string
	// RootFile is the CA's root-cert.pem (the agent's CA_ROOT_CA), and
	// Root the root itself, made with the test PKI and written before
	// the CA first starts, so that a test can trust it while the CA is
	// still down.
	RootFile string
	Root     *pki.CA
	// Logs is the CA's log: each certificate it issues is a line with the
	// caller's cluster ID and requested lifetime.
	Logs *testkit.LogBuffer

	svc     *ca.Service
	health  *testkit.HealthRecorder
	metrics *prometheus.Registry
	serving *testkit.Serving
}

// New is a CA with its root written, not yet serving: Start it.
func New(t testing.TB, o Options) *CA {
	t.Helper()
	root := pki.NewRoot(t, "istioca test root")
	dir := filepath.Join(t.TempDir(), "ca")
	cfg := ca.NewConfig(testkit.FreeAddr(t), dir, time.Hour, testkit.TableDefault[string](t, "TRUST_DOMAIN"))
	if o.Lifetime > 0 {
		cfg.CertLifetime = o.Lifetime
	}
	cfg.Token = o.Token
	testkit.WriteFile(t, cfg.RootCertPath(), root.CertPEM)
	testkit.WriteFile(t, cfg.RootKeyPath(), pki.KeyPEM(t, root.Key))
	c := &CA{Addr: cfg.Listen, RootFile: cfg.RootCertPath(), Root: root, Logs: testkit.NewLogBuffer(t),
		health: &testkit.HealthRecorder{}, metrics: prometheus.NewRegistry()}
	svc, err := ca.New(cfg, ca.Inputs{}, ca.Outputs{}, messages.NewRuntime(ca.Name, c.health, nil, c.metrics, c.Logs.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	c.svc = svc
	return c
}

// Start is New and Start.
func Start(t testing.TB, o Options) *CA {
	t.Helper()
	c := New(t, o)
	c.Start(t)
	return c
}

// Start serves until Stop or the end of the test, and returns once the CA
// listens.
func (c *CA) Start(t testing.TB) {
	t.Helper()
	c.serving = testkit.Serve(t, c.svc)
	testkit.WaitFor(t, "the CA to listen on "+c.Addr, func() bool { return c.svc.Addr() != "" })
}

// Stop stops the CA: its address refuses connections until Start.
func (c *CA) Stop(t testing.TB) {
	t.Helper()
	if c.serving != nil {
		c.serving.Stop(t)
		c.serving = nil
	}
}

// Issued is how many certificates the CA has signed.
func (c *CA) Issued(t testing.TB) int {
	t.Helper()
	return int(testkit.MetricValue(t, c.metrics, "ca_certificates_issued_total"))
}

// Requests is how many certificate requests reached the CA, signed or
// refused.
func (c *CA) Requests(t testing.TB) int {
	t.Helper()
	return c.Issued(t) + int(testkit.MetricValue(t, c.metrics, "ca_requests_rejected_total"))
}
