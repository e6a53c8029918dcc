package ca

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type server struct {
	svc     *Service
	cfg     Config
	now     time.Time // the CA's clock, frozen: lifetimes are checked to the second
	health  *testkit.HealthRecorder
	logs    *testkit.LogBuffer
	serving *testkit.Serving
}

// startCA serves a CA with its root in dir (a new temp dir when empty).
func startCA(t *testing.T, dir string, edit func(*Config)) *server {
	t.Helper()
	if dir == "" {
		dir = filepath.Join(t.TempDir(), "ca")
	}
	s := &server{cfg: testConfig(t, dir), now: time.Now().Truncate(time.Second),
		health: &testkit.HealthRecorder{}, logs: testkit.NewLogBuffer(t)}
	if edit != nil {
		edit(&s.cfg)
	}
	svc, err := New(s.cfg, Inputs{}, Outputs{}, messages.NewRuntime(Name, s.health, testkit.FrozenClock{At: s.now}, nil, s.logs.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	s.svc = svc
	s.serving = testkit.Serve(t, svc)
	s.health.WaitState(t, messages.Ready, "")
	return s
}

func (s *server) stop(t *testing.T) {
	t.Helper()
	s.serving.Stop(t)
}

// client verifies the CA with root-cert.pem, as the agent does with
// CA_ROOT_CA, for the server name given (the agent uses CA_ADDR's host).
func (s *server) client(t *testing.T, serverName string) pb.IstioCertificateServiceClient {
	t.Helper()
	rootPEM, err := os.ReadFile(s.cfg.RootCertPath())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(rootPEM) {
		t.Fatal("root-cert.pem holds no certificate")
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12})
	conn, err := grpc.NewClient(s.svc.Addr(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewIstioCertificateServiceClient(conn)
}

const workloadID = "spiffe://cluster.local/ns/default/sa/default"

func newCSR(t *testing.T, key crypto.Signer, uris ...string) string {
	t.Helper()
	tmpl := &x509.CertificateRequest{}
	for _, u := range uris {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

func ecKey(t *testing.T) crypto.Signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func withToken(token string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	return ctx, cancel
}

func request(t *testing.T, c pb.IstioCertificateServiceClient, token, csr string, validitySeconds int64) (*pb.IstioCertificateResponse, error) {
	t.Helper()
	ctx, cancel := withToken(token)
	defer cancel()
	return c.CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: csr, ValidityDuration: validitySeconds})
}

func parsePEMCert(t *testing.T, s string) *x509.Certificate {
	t.Helper()
	block, rest := pem.Decode([]byte(s))
	if block == nil || block.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
		t.Fatalf("not one PEM certificate: %q", s)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The agent's path: a CSR for its SPIFFE ID, over TLS verified with
// root-cert.pem, with a bearer token. The answer is [leaf, root], the leaf
// carrying the ID and the CSR's key, verifying against the root.
func TestCSRRoundTrip(t *testing.T) {
	s := startCA(t, "", nil)
	for _, tc := range []struct {
		name string
		key  func(*testing.T) crypto.Signer
	}{
		{"ECDSA", ecKey},
		{"RSA", func(t *testing.T) crypto.Signer {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				t.Fatal(err)
			}
			return k
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.key(t)
			resp, err := request(t, s.client(t, "localhost"), "any-token", newCSR(t, key, workloadID), 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetCertChain()) != 2 {
				t.Fatalf("chain has %d elements, want leaf and root", len(resp.GetCertChain()))
			}
			rootOnDisk, err := os.ReadFile(s.cfg.RootCertPath())
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetCertChain()[1] != string(rootOnDisk) {
				t.Error("the last element is not root-cert.pem")
			}
			leaf, root := parsePEMCert(t, resp.GetCertChain()[0]), parsePEMCert(t, resp.GetCertChain()[1])
			pool := x509.NewCertPool()
			pool.AddCert(root)
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: s.now,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); err != nil {
				t.Errorf("leaf does not verify against the root: %v", err)
			}
			if len(leaf.URIs) != 1 || leaf.URIs[0].String() != workloadID {
				t.Errorf("leaf URIs %v", leaf.URIs)
			}
			if !key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(leaf.PublicKey) {
				t.Error("leaf does not carry the CSR's key")
			}
			if leaf.IsCA {
				t.Error("leaf is a CA")
			}
		})
	}
	if n := testutil.ToFloat64(s.svc.m.issued); n != 2 {
		t.Errorf("issued counter %v, want 2", n)
	}
}

// The log line of an issued certificate names the cluster the caller says
// it is in (Istio's ClusterID metadata), for whoever reads the log.
func TestIssuedLogNamesTheCallersCluster(t *testing.T) {
	s := startCA(t, "", nil)
	ctx, cancel := withToken("any-token")
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "clusterid", "Kubernetes")
	if _, err := s.client(t, "localhost").CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: newCSR(t, ecKey(t), workloadID)}); err != nil {
		t.Fatal(err)
	}
	s.logs.WaitLine(t, "certificate issued", "cluster_id=Kubernetes")
}

// The requested validity is honoured up to CertLifetime; none requested is
// CertLifetime. NotBefore is backdated by a tenth of the lifetime (at most
// Istio's 2 minutes), so that a short certificate is not due for renewal
// on arrival.
func TestLifetimeHonouredUpToCertLifetime(t *testing.T) {
	s := startCA(t, "", func(c *Config) { c.CertLifetime = time.Hour })
	c := s.client(t, "127.0.0.1")
	for _, tc := range []struct {
		name      string
		requested int64
		lifetime  time.Duration
		backdate  time.Duration
	}{
		{"shorter than the maximum", 600, 10 * time.Minute, time.Minute},
		{"none requested", 0, time.Hour, 2 * time.Minute},
		{"negative", -5, time.Hour, 2 * time.Minute},
		{"longer than the maximum (the agent's default 24h)", 86400, time.Hour, 2 * time.Minute},
		{"very short", 30, 30 * time.Second, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := request(t, c, "t", newCSR(t, ecKey(t), workloadID), tc.requested)
			if err != nil {
				t.Fatal(err)
			}
			leaf := parsePEMCert(t, resp.GetCertChain()[0])
			if got := leaf.NotAfter.Sub(s.now); got != tc.lifetime {
				t.Errorf("NotAfter is now + %v, want + %v", got, tc.lifetime)
			}
			if got := s.now.Sub(leaf.NotBefore); got != tc.backdate {
				t.Errorf("NotBefore is now - %v, want - %v", got, tc.backdate)
			}
		})
	}
}

func TestBadCSRs(t *testing.T) {
	s := startCA(t, "", nil)
	c := s.client(t, "localhost")
	key := ecKey(t)
	good := newCSR(t, key, workloadID)
	// Flip a bit in the signature (the end of the DER): it parses, but does
	// not verify.
	block, _ := pem.Decode([]byte(good))
	block.Bytes[len(block.Bytes)-3] ^= 0x01
	tampered := string(pem.EncodeToMemory(block))

	for _, tc := range []struct {
		name, csr string
		code      codes.Code
		want      []string
	}{
		{"not PEM", "hello", codes.InvalidArgument, []string{"bad certificate signing request"}},
		{"a certificate, not a CSR", strings.Replace(good, "CERTIFICATE REQUEST", "CERTIFICATE", 2), codes.InvalidArgument, []string{"CERTIFICATE REQUEST"}},
		{"bad signature", tampered, codes.InvalidArgument, []string{"signature"}},
		{"no SPIFFE ID", newCSR(t, key), codes.PermissionDenied, []string{"no URI SAN", "spiffe://cluster.local/"}},
		{"other trust domain", newCSR(t, key, "spiffe://evil.example/ns/default/sa/default"), codes.PermissionDenied,
			[]string{"spiffe://evil.example/ns/default/sa/default", "trust domain cluster.local"}},
		{"not spiffe", newCSR(t, key, "https://cluster.local/ns/default/sa/default"), codes.PermissionDenied, []string{"https://cluster.local"}},
		{"one good, one bad", newCSR(t, key, workloadID, "spiffe://other/x"), codes.PermissionDenied, []string{"spiffe://other/x"}},
		{"trust domain alone", newCSR(t, key, "spiffe://cluster.local"), codes.PermissionDenied, []string{"not a SPIFFE ID"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := request(t, c, "t", tc.csr, 0)
			if status.Code(err) != tc.code {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(status.Convert(err).Message(), w) {
					t.Errorf("message %q lacks %q", status.Convert(err).Message(), w)
				}
			}
		})
	}
	if n := testutil.ToFloat64(s.svc.m.rejected.WithLabelValues("bad_csr")); n != 3 {
		t.Errorf("bad_csr rejections %v, want 3", n)
	}
	if n := testutil.ToFloat64(s.svc.m.rejected.WithLabelValues("identity")); n != 5 {
		t.Errorf("identity rejections %v, want 5", n)
	}
	if n := testutil.ToFloat64(s.svc.m.issued); n != 0 {
		t.Errorf("issued %v", n)
	}
}

func TestTokens(t *testing.T) {
	csr := newCSR(t, ecKey(t), workloadID)
	t.Run("any token when none is configured", func(t *testing.T) {
		s := startCA(t, "", nil)
		c := s.client(t, "localhost")
		if _, err := request(t, c, "whatever", csr, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := request(t, c, "", csr, 0); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("no token: %v, want Unauthenticated", err)
		}
		if strings.Contains(s.logs.String(), "whatever") {
			t.Error("the token is in the log")
		}
		if !strings.Contains(s.logs.String(), "not checked") {
			t.Errorf("an unchecked token is not logged as such:\n%s", s.logs)
		}
	})
	t.Run("the configured token only", func(t *testing.T) {
		s := startCA(t, "", func(c *Config) { c.Token = "s3cret" })
		c := s.client(t, "localhost")
		for token, want := range map[string]codes.Code{"": codes.Unauthenticated, "nope": codes.Unauthenticated, "s3cret": codes.OK} {
			if _, err := request(t, c, token, csr, 0); status.Code(err) != want {
				t.Errorf("token %q: %v, want %v", token, err, want)
			}
		}
		if n := testutil.ToFloat64(s.svc.m.rejected.WithLabelValues("unauthenticated")); n != 2 {
			t.Errorf("unauthenticated rejections %v, want 2", n)
		}
	})
}

// A certificate the CA issued authenticates its holder without a token,
// for its own identities only: how a VM renews once its onboarding token
// has expired (PROV_CERT, Istio's ClientCertAuthenticator). A certificate
// from another root fails the handshake.
func TestClientCertificateAuthenticates(t *testing.T) {
	s := startCA(t, "", func(c *Config) { c.Token = "s3cret" })
	key := ecKey(t)
	resp, err := request(t, s.client(t, "localhost"), "s3cret", newCSR(t, key, workloadID), 0)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	issued, err := tls.X509KeyPair([]byte(strings.Join(resp.GetCertChain(), "")), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	withCert := s.clientWith(t, issued)
	if _, err := request(t, withCert, "", newCSR(t, ecKey(t), workloadID), 0); err != nil {
		t.Fatalf("renewal with the issued certificate and no token: %v", err)
	}
	s.logs.WaitLine(t, "certificate issued", "caller=\"certificate "+workloadID+"\"")
	other := "spiffe://cluster.local/ns/default/sa/admin"
	if _, err := request(t, withCert, "", newCSR(t, ecKey(t), other), 0); status.Code(err) != codes.PermissionDenied {
		t.Errorf("another identity with the certificate: %v, want PermissionDenied", err)
	}

	foreign := selfSigned(t, workloadID)
	if _, err := request(t, s.clientWith(t, foreign), "", newCSR(t, ecKey(t), workloadID), 0); status.Code(err) != codes.Unavailable {
		t.Errorf("a certificate of another root: %v, want the handshake to fail (Unavailable)", err)
	}
}

// clientWith is client presenting cert whatever the CA asks for, as the
// agent does (GetClientCertificate).
func (s *server) clientWith(t *testing.T, cert tls.Certificate) pb.IstioCertificateServiceClient {
	t.Helper()
	rootPEM, err := os.ReadFile(s.cfg.RootCertPath())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(rootPEM)
	creds := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }})
	conn, err := grpc.NewClient(s.svc.Addr(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewIstioCertificateServiceClient(conn)
}

// selfSigned is a client certificate for id that no CA issued.
func selfSigned(t *testing.T, id string) tls.Certificate {
	t.Helper()
	key := ecKey(t)
	u, _ := url.Parse(id)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		URIs: []*url.URL{u}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// The root is generated once and reused: certificates issued before a
// restart still verify after it, and the key stays owner-only.
func TestRootPersistsAcrossRestarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	s := startCA(t, dir, nil)
	first, err := request(t, s.client(t, "localhost"), "t", newCSR(t, ecKey(t), workloadID), 0)
	if err != nil {
		t.Fatal(err)
	}
	s.stop(t)
	fi, err := os.Stat(s.cfg.RootKeyPath())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("root key mode %v, want 0600", fi.Mode().Perm())
	}

	s2 := startCA(t, dir, nil)
	if strings.Contains(s2.logs.String(), "generated a new root") {
		t.Error("restart generated a new root")
	}
	second, err := request(t, s2.client(t, "localhost"), "t", newCSR(t, ecKey(t), workloadID), 0)
	if err != nil {
		t.Fatal(err)
	}
	if first.GetCertChain()[1] != second.GetCertChain()[1] {
		t.Fatal("the root changed across a restart")
	}
	pool := x509.NewCertPool()
	pool.AddCert(parsePEMCert(t, second.GetCertChain()[1]))
	if _, err := parsePEMCert(t, first.GetCertChain()[0]).Verify(x509.VerifyOptions{Roots: pool, CurrentTime: s2.now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("a certificate from before the restart does not verify after it: %v", err)
	}
}

// Half a root is an error naming the missing file, never silently replaced.
func TestHalfARootIsRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	s := startCA(t, dir, nil)
	s.stop(t)
	if err := os.Remove(s.cfg.RootKeyPath()); err != nil {
		t.Fatal(err)
	}
	cfg := s.cfg
	svc, err := New(cfg, Inputs{}, Outputs{}, messages.NewRuntime(Name, messages.NewCell[messages.Health](), nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	defer cancel()
	err = svc.Serve(ctx)
	if !errors.Is(err, ErrHalfRoot) || !strings.Contains(err.Error(), cfg.RootKeyPath()) {
		t.Fatalf("Serve = %v, want ErrHalfRoot naming %s", err, cfg.RootKeyPath())
	}
}

// The serving certificate holds localhost, the loopback IPs and the
// configured names, and nothing else.
func TestServingCertificateNames(t *testing.T) {
	s := startCA(t, "", func(c *Config) { c.ServingSANs = []string{"ca.mesh.test", "127.0.0.53"} })
	csr := newCSR(t, ecKey(t), workloadID)
	for _, name := range []string{"localhost", "127.0.0.1", "::1", "ca.mesh.test", "127.0.0.53"} {
		if _, err := request(t, s.client(t, name), "t", csr, 0); err != nil {
			t.Errorf("server name %s: %v", name, err)
		}
	}
	if _, err := request(t, s.client(t, "other.test"), "t", csr, 0); status.Code(err) != codes.Unavailable ||
		!strings.Contains(err.Error(), "certificate") {
		t.Errorf("server name other.test: %v, want a TLS failure", err)
	}
}

// testConfig is a CA on a free loopback port with its root in dir, issuing
// for an hour in the env table's trust domain.
func testConfig(t testing.TB, dir string) Config {
	return NewConfig("127.0.0.1:0", dir, time.Hour, testkit.TableDefault[string](t, "TRUST_DOMAIN"))
}

func TestConfigValidate(t *testing.T) {
	testkit.EachEditRejected(t, testConfig(t, "/tmp/ca"), map[string]func(*Config){
		"non-loopback listen": func(c *Config) { c.Listen = "0.0.0.0:16012" },
		"no listen":           func(c *Config) { c.Listen = "" },
		"no trust domain":     func(c *Config) { c.TrustDomain = "" },
		"no root dir":         func(c *Config) { c.RootDir = "" },
		"no lifetime":         func(c *Config) { c.CertLifetime = 0 },
		"bad trust domain":    func(c *Config) { c.TrustDomain = "Cluster Local" },
		"empty serving SAN":   func(c *Config) { c.ServingSANs = []string{""} },
	})
}
