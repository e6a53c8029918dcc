package xdsproxy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/messages/compliance"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// tlsProxyConfig is a TLS proxy for the control plane at addr, trusting
// rootPEM from the CA root file and sending token from the token file.
func tlsProxyConfig(t *testing.T, addr string, rootPEM []byte, token string) Config {
	t.Helper()
	root := tempRoot(t)
	cfg := testConfig(root, addr)
	cfg.Plaintext = false
	cfg.OfflineCache = false
	testkit.WriteFile(t, cfg.RootCAFile, rootPEM)
	if token != "" {
		testkit.WriteFile(t, cfg.TokenFile, []byte(token+"\n"))
	}
	return cfg
}

// TLS to the control plane with Istio's server name rule ("localhost" is
// istiod.istio-system.svc), the bearer token read from its file, and the
// ClusterID and XDS_HEADER_* metadata on the stream.
func TestTLSTokenAndMetadata(t *testing.T) {
	ca := pki.NewRoot(t, "istio-ca")
	cp := controlPlane(t, xdsserver.Options{TLS: ca.ServerTLS(t, "istiod.istio-system.svc", "127.0.0.1"), Token: "good-token"})
	snapshot(t, cp, "v1", 2)
	_, port, _ := net.SplitHostPort(cp.Addr())
	cfg := tlsProxyConfig(t, "localhost:"+port, ca.CertPEM, "good-token")
	cfg.ClusterID = "Kubernetes"
	cfg.Headers = map[string]string{"X-Mesh-Test": "yes"}
	p := startProxy(t, cfg, proxyOpts{})
	c := p.client(t, true)
	if err := c.WaitFor(waitCtx(t), hasVersion(resource.ClusterType, "v1", 2)); err != nil {
		t.Fatal(err)
	}
	md := cp.Stats().Metadata
	for k, want := range map[string]string{"clusterid": "Kubernetes", "x-mesh-test": "yes", "authorization": "Bearer good-token"} {
		if got := md.Get(k); len(got) != 1 || got[0] != want {
			t.Errorf("stream metadata %s = %q, want %q", k, got, want)
		}
	}
}

// A token the control plane refuses, a missing token and an untrusted
// certificate each say so in XDSState and Health, naming what to check;
// readiness is not lost (Degraded serves).
func TestUpstreamErrorsAreExplained(t *testing.T) {
	ca := pki.NewRoot(t, "istio-ca")
	other := pki.NewRoot(t, "someone-else")
	cp := controlPlane(t, xdsserver.Options{TLS: ca.ServerTLS(t, "istiod.istio-system.svc", "127.0.0.1"), Token: "good-token"})
	snapshot(t, cp, "v1", 1)
	cases := []struct {
		name  string
		root  []byte
		token string
		want  []string
	}{
		{"wrong token", ca.CertPEM, "stolen-token", []string{"rejected the agent's credentials", "token from", "istio-token", "Unauthenticated"}},
		{"no token", ca.CertPEM, "", []string{"rejected the agent's credentials", "Unauthenticated"}},
		{"untrusted root", other.CertPEM, "good-token", []string{"TLS handshake with the control plane failed", "root-cert.pem", "istiod.istio-system.svc", "x509"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tlsProxyConfig(t, cp.Addr(), tc.root, tc.token)
			cfg.ServerName = "istiod.istio-system.svc" // ISTIOD_SAN: the address is an IP
			p := startProxy(t, cfg, proxyOpts{})
			c := p.client(t, false)
			st := p.waitState(t, "the upstream down", func(s messages.XDSState) bool { return s.Upstream == messages.XDSDown })
			testkit.Contains(t, "XDSState.LastError", st.LastError, tc.want...)
			h := p.waitHealth(t, "Degraded", func(h messages.Health) bool { return h.State == messages.Degraded })
			testkit.Contains(t, "Health.Reason", h.Reason, append(tc.want, "unreachable since")...)
			if !h.State.Serving() {
				t.Errorf("health %v does not serve: readiness would fail", h.State)
			}
			if err := c.WaitFor(waitCtx(t), func(s xdsserver.State) bool { return len(s.Ends) >= 1 }); err != nil {
				t.Fatal(err)
			}
			if tc.name == "wrong token" {
				// The control plane's status reaches Envoy unchanged.
				if end := c.State().Ends[0]; status.Code(end) != codes.Unauthenticated {
					t.Errorf("Envoy's stream ended with %v, want the control plane's Unauthenticated", end)
				}
			}
			if c.State().Counts[resource.ClusterType] != 0 {
				t.Error("the client got configuration through a refused upstream")
			}
			if got := p.metric(t, "istiod_connection_terminations", "type", "error") + p.metric(t, "istiod_connection_failures"); got < 1 {
				t.Errorf("no connection failure or termination counted")
			}
		})
	}
}

// The workload certificate is the client certificate when configured,
// with the roots from the certificate bundle (file-mounted certs); an
// expired one is not sent, and the stream works on the token alone, as
// with Istio.
func TestClientCertificateFromBundle(t *testing.T) {
	ca := pki.NewRoot(t, "istio-ca")
	serverTLS := ca.ServerTLS(t, "istiod.istio-system.svc", "127.0.0.1")
	serverTLS.ClientAuth = tls.RequestClientCert
	var presented atomic.Int64 // certificates in the last handshake
	serverTLS.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		presented.Store(int64(len(raw)))
		return nil
	}
	cp := controlPlane(t, xdsserver.Options{TLS: serverTLS})
	snapshot(t, cp, "v1", 1)

	for _, expired := range []bool{false, true} {
		name := map[bool]string{false: "valid", true: "expired"}[expired]
		t.Run(name, func(t *testing.T) {
			presented.Store(-1)
			notAfter := time.Now().Add(time.Hour)
			if expired {
				notAfter = time.Now().Add(-time.Minute)
			}
			chain, key := ca.Leaf(t, pki.Leaf{SPIFFE: pki.WorkloadID, NotAfter: notAfter})
			certs := messages.NewCell[messages.CertBundle]()
			certs.Send(messages.CertBundle{CertChainPEM: chain, KeyPEM: key, RootsPEM: ca.CertPEM, Expiry: notAfter, Version: name})
			cfg := testConfig(tempRoot(t), cp.Addr())
			cfg.Plaintext, cfg.OfflineCache = false, false
			cfg.Roots, cfg.ClientCertificate, cfg.ServerName = RootsCertBundle, true, "istiod.istio-system.svc"
			p := startProxy(t, cfg, proxyOpts{in: Inputs{Certs: certs}})
			c := p.client(t, false)
			if err := c.WaitFor(waitCtx(t), hasVersion(resource.ClusterType, "v1", 1)); err != nil {
				t.Fatal(err)
			}
			want := int64(1)
			if expired {
				want = 0
				testkit.Contains(t, "logs", p.logs.String(), "workload certificate expired")
			}
			if got := presented.Load(); got != want {
				t.Errorf("the proxy presented %d certificates, want %d", got, want)
			}
		})
	}
}

// PROV_CERT (a VM's /etc/certs): the client certificate is the directory's
// cert-chain.pem and key.pem, read at each connection, as Istio's
// GetKeyCertsForXDS; not the bundle, which the proxy is not given. An
// expired one is not sent, and the token carries the stream.
func TestClientCertificateFromProvisioningDir(t *testing.T) {
	ca := pki.NewRoot(t, "istio-ca")
	serverTLS := ca.ServerTLS(t, "istiod.istio-system.svc", "127.0.0.1")
	serverTLS.ClientAuth = tls.RequestClientCert
	var presented atomic.Value // the leaf of the last handshake, []byte{} for none
	serverTLS.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		leaf := []byte{}
		if len(raw) > 0 {
			leaf = raw[0]
		}
		presented.Store(leaf)
		return nil
	}
	cp := controlPlane(t, xdsserver.Options{TLS: serverTLS, Token: "good-token"})
	snapshot(t, cp, "v1", 1)

	for _, expired := range []bool{false, true} {
		name := map[bool]string{false: "valid", true: "expired"}[expired]
		t.Run(name, func(t *testing.T) {
			presented.Store([]byte(nil))
			notAfter := time.Now().Add(time.Hour)
			if expired {
				notAfter = time.Now().Add(-time.Minute)
			}
			chain, key := ca.Leaf(t, pki.Leaf{SPIFFE: pki.WorkloadID, NotAfter: notAfter})
			cfg := tlsProxyConfig(t, cp.Addr(), ca.CertPEM, "good-token")
			cfg.ServerName = "istiod.istio-system.svc"
			cfg.ProvCertDir = t.TempDir()
			testkit.WriteFile(t, filepath.Join(cfg.ProvCertDir, "cert-chain.pem"), chain)
			testkit.WriteFile(t, filepath.Join(cfg.ProvCertDir, "key.pem"), key)
			p := startProxy(t, cfg, proxyOpts{})
			c := p.client(t, false)
			if err := c.WaitFor(waitCtx(t), hasVersion(resource.ClusterType, "v1", 1)); err != nil {
				t.Fatal(err)
			}
			want := pki.ParseLeaf(t, chain).Raw
			if expired {
				want = []byte{}
				testkit.Contains(t, "logs", p.logs.String(), "provisioning certificate not usable", "expired")
			}
			if got, _ := presented.Load().([]byte); !bytes.Equal(got, want) {
				t.Errorf("the proxy presented %d bytes of leaf, want %d (the PROV_CERT file's)", len(got), len(want))
			}
		})
	}
}

// COMPLIANCE_POLICY=pqc on the XDS upstream (#35): a control plane with
// Go's defaults (X25519MLKEM768 offered) serves; one offering only
// classical key exchanges is refused at the handshake, and says so.
func TestCompliancePolicyPQC(t *testing.T) {
	ca := pki.NewRoot(t, "istio-ca")
	for _, classicalOnly := range []bool{false, true} {
		t.Run(map[bool]string{false: "post-quantum server", true: "classical-only server"}[classicalOnly], func(t *testing.T) {
			serverTLS := ca.ServerTLS(t, "istiod.istio-system.svc", "127.0.0.1")
			if classicalOnly {
				serverTLS.CurvePreferences = []tls.CurveID{tls.X25519, tls.CurveP256, tls.CurveP384}
			}
			cp := controlPlane(t, xdsserver.Options{TLS: serverTLS})
			snapshot(t, cp, "v1", 1)
			cfg := tlsProxyConfig(t, cp.Addr(), ca.CertPEM, "")
			cfg.ServerName = "istiod.istio-system.svc"
			cfg.CompliancePolicy = compliance.PQC
			p := startProxy(t, cfg, proxyOpts{})
			c := p.client(t, !classicalOnly)
			if !classicalOnly {
				if err := c.WaitFor(waitCtx(t), hasVersion(resource.ClusterType, "v1", 1)); err != nil {
					t.Fatal(err)
				}
				return
			}
			st := p.waitState(t, "the upstream down", func(s messages.XDSState) bool { return s.Upstream == messages.XDSDown })
			testkit.Contains(t, "XDSState.LastError", st.LastError, "TLS handshake with the control plane failed")
			if c.State().Counts[resource.ClusterType] != 0 {
				t.Error("the client got configuration through a refused handshake")
			}
		})
	}
}
