package certs

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	pb "istio.io/api/security/v1alpha1"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/messages/compliance"
	meshca "github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/services/internal/pemblock"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/istioca"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

const testToken = "test-jwt-token"

// shortChainCA answers every request with one certificate and no root,
// as a CA that leaves its root out of cert_chain would (the real CA of
// the test kit never does). It serves TLS for 127.0.0.1 with a
// certificate from root, offering only curves when given, and returns its
// address.
func shortChainCA(t *testing.T, root *pki.CA, curves ...tls.CurveID) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serverTLS := root.ServerTLS(t, "127.0.0.1")
	serverTLS.CurvePreferences = curves
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS)))
	pb.RegisterIstioCertificateServiceServer(srv, shortChain{chain: string(root.CertPEM)})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

type shortChain struct {
	pb.UnimplementedIstioCertificateServiceServer
	chain string
}

func (s shortChain) CreateCertificate(context.Context, *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	return &pb.IstioCertificateResponse{CertChain: []string{s.chain}}, nil
}

// caSetup is a root dir with the CA root and token files.
type caSetup struct {
	ca     *istioca.CA // the agent's own CA, not yet started
	root   string
	cfg    Config
	out    *testkit.Recorder[messages.CertBundle]
	health *testkit.HealthRecorder
	logs   *testkit.LogBuffer
	reg    prometheus.Registerer
}

func newCASetup(t *testing.T, lifetime time.Duration) *caSetup {
	ca := istioca.New(t, istioca.Options{Lifetime: lifetime, Token: testToken})
	root := t.TempDir()
	c := &caSetup{ca: ca, root: root, out: &testkit.Recorder[messages.CertBundle]{}, health: &testkit.HealthRecorder{}, logs: &testkit.LogBuffer{}}
	c.cfg = chooseSource(testConfig(t, root), root, false)
	c.cfg.CAAddr = ca.Addr
	c.cfg.KeyAlgorithm = ECDSA // fast; RSA is covered by TestCARSAKey
	c.cfg.ClusterID = "Kubernetes"
	c.cfg.Namespace, c.cfg.ServiceAccount = "shop", "cart"
	c.cfg.RetryInitial = 50 * time.Millisecond
	c.cfg.RetryMax = 400 * time.Millisecond
	testkit.WriteFile(t, c.cfg.CARootFile, ca.Root.CertPEM)
	testkit.WriteFile(t, c.cfg.TokenFile, []byte(testToken+"\n"))
	return c
}

func (c *caSetup) start(t *testing.T) *testkit.Serving {
	return testkit.Serve(t, newService(t, c.cfg, c.out, c.health, c.logs.Logger(), nil, c.reg))
}

func TestCAIssuesSpiffeCertificate(t *testing.T) {
	c := newCASetup(t, time.Hour)
	c.ca.Start(t)
	c.cfg.OutputCertsDir = filepath.Join(c.root, "out")
	c.start(t)
	b := c.out.WaitLast(t, "certificate from CA", func(b messages.CertBundle) bool { return b.Version != "" })
	c.health.WaitState(t, messages.Ready, "")
	if string(b.RootsPEM) != string(c.ca.Root.CertPEM) {
		t.Error("roots are not the last element of the CA's chain")
	}
	certs, err := parseCerts(b.CertChainPEM)
	if err != nil || len(certs) != 2 {
		t.Fatalf("chain: %d certs, %v", len(certs), err)
	}
	if got := certs[0].URIs[0].String(); got != "spiffe://cluster.local/ns/shop/sa/cart" {
		t.Errorf("SAN %s", got)
	}
	// The request: Istio's ClusterID metadata and SECRET_TTL.
	c.ca.Logs.WaitLine(t, "certificate issued", "cluster_id=Kubernetes", "requested=24h0m0s")
	if _, err := pemblock.ParseKey(b.KeyPEM); err != nil {
		t.Fatal(err)
	}
	// OUTPUT_CERTS: the three files, owner-only.
	for _, n := range []string{KeyFileName, CertChainFileName, RootCertFileName} {
		p := filepath.Join(c.cfg.OutputCertsDir, n)
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
	if got, _ := os.ReadFile(filepath.Join(c.cfg.OutputCertsDir, KeyFileName)); string(got) != string(b.KeyPEM) {
		t.Error("OUTPUT_CERTS key.pem is not the served key")
	}
}

// A short-lived certificate is renewed before it expires.
func TestCARenewsBeforeExpiry(t *testing.T) {
	c := newCASetup(t, 4*time.Second)
	c.ca.Start(t)
	c.start(t)
	b1 := c.out.WaitLast(t, "first certificate", func(b messages.CertBundle) bool { return b.Version != "" })
	b2 := c.out.WaitLast(t, "renewed certificate", func(b messages.CertBundle) bool { return b.Version != b1.Version })
	if !time.Now().Before(b1.Expiry) {
		t.Fatalf("renewed only at %v, after the first expired at %v", time.Now(), b1.Expiry)
	}
	if !b2.Expiry.After(b1.Expiry) {
		t.Fatal("renewed certificate does not outlive the first")
	}
}

// A VM renews with the certificate it was last issued once its onboarding
// token is gone (PROV_CERT = OUTPUT_CERTS, Istio's VM defaults): the
// renewal presents it, and so does the next start, whose first request
// has no token either. Without it the CA refuses both (Unauthenticated)
// and the workload loses its identity when the certificate expires.
func TestCARenewsWithProvisioningCertificate(t *testing.T) {
	c := newCASetup(t, 4*time.Second)
	c.ca.Start(t)
	dir := filepath.Join(c.root, "vm-certs")
	c.cfg.OutputCertsDir, c.cfg.ProvCertDir = dir, dir
	first := c.start(t)
	b1 := c.out.WaitLast(t, "first certificate, with the token", func(b messages.CertBundle) bool { return b.Version != "" })
	c.ca.Logs.WaitLine(t, "certificate issued", "caller=\"token")
	if err := os.Remove(c.cfg.TokenFile); err != nil {
		t.Fatal(err)
	}
	b2 := c.out.WaitLast(t, "renewal without a token", func(b messages.CertBundle) bool { return b.Version != "" && b.Version != b1.Version })
	c.ca.Logs.WaitLine(t, "certificate issued", "caller=\"certificate spiffe://cluster.local/ns/shop/sa/cart\"")
	if strings.Contains(c.logs.String(), "certificate request failed") {
		t.Errorf("a request failed on the way:\n%s", c.logs)
	}
	first.Stop(t)

	// The next start: a new service, no token, the files of the last run.
	out := &testkit.Recorder[messages.CertBundle]{}
	testkit.Serve(t, newService(t, c.cfg, out, &testkit.HealthRecorder{}, c.logs.Logger(), nil, nil))
	b3 := out.WaitLast(t, "a certificate at the next start, without a token", func(b messages.CertBundle) bool { return b.Version != "" })
	if b3.Version == b2.Version {
		t.Error("the next start published the last run's certificate, not one of its own")
	}
}

// A change of the ProxyConfig's trust anchors (caCertificatesPem, from the
// XDS proxy) asks the CA for a new certificate at once, as Istio's agent
// does (UpdateConfigTrustBundle drops its workload certificate); the same
// anchors sent again ask for nothing.
func TestCAResignsWhenTrustAnchorsChange(t *testing.T) {
	c := newCASetup(t, time.Hour)
	c.ca.Start(t)
	anchors := messages.NewCell[messages.TrustAnchors]()
	s, err := New(c.cfg, Inputs{TrustAnchors: anchors}, Outputs{Certs: c.out}, messages.NewRuntime(Name, c.health, nil, nil, c.logs.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, s)
	first := c.out.WaitLast(t, "the first certificate", func(b messages.CertBundle) bool { return b.Version != "" })

	extra := pki.NewRoot(t, "extra anchor")
	anchors.Send(messages.TrustAnchors{PEM: [][]byte{extra.CertPEM}, Version: "a1"})
	second := c.out.WaitLast(t, "a certificate under the new anchors", func(b messages.CertBundle) bool { return b.Version != first.Version })
	c.logs.WaitLine(t, "trust anchors changed")
	if n := c.ca.Requests(t); n != 2 {
		t.Errorf("CA requests after one change of the anchors: %d, want 2", n)
	}

	anchors.Send(messages.TrustAnchors{PEM: [][]byte{extra.CertPEM}, Version: "a2"}) // the same anchors
	anchors.Send(messages.TrustAnchors{PEM: [][]byte{extra.CertPEM, pki.NewRoot(t, "another").CertPEM}, Version: "a3"})
	c.out.WaitLast(t, "a certificate under the anchors changed again", func(b messages.CertBundle) bool { return b.Version != second.Version })
	if n := c.ca.Requests(t); n != 3 {
		t.Errorf("CA requests after the same anchors, then new ones: %d, want 3", n)
	}
}

// The renewal point is kept on the agent's clock (Runtime.Clock), not the
// system's: a certificate is asked for again exactly when GraceRatio of its
// lifetime remains on that clock, and not a second earlier.
func TestCARenewsAtRenewalPointOnAgentClock(t *testing.T) {
	c := newCASetup(t, time.Hour)
	c.cfg.GraceJitter = 0
	c.ca.Start(t)
	clock := testkit.NewManualClock()
	clock.Advance(time.Since(clock.Now())) // the CA signs on the system's time
	testkit.Serve(t, newService(t, c.cfg, c.out, c.health, c.logs.Logger(), clock, nil))
	b1 := c.out.WaitLast(t, "first certificate", func(b messages.CertBundle) bool { return b.Version != "" })
	leaf, err := parseCerts(b1.CertChainPEM)
	if err != nil {
		t.Fatal(err)
	}
	renewAt := b1.Expiry.Add(-time.Duration(c.cfg.GraceRatio * float64(b1.Expiry.Sub(leaf[0].NotBefore))))
	// The bundle says when, for /debug/certs (#22).
	if !b1.RenewAt.Equal(renewAt) {
		t.Errorf("the bundle's RenewAt %v, want the renewal point %v", b1.RenewAt, renewAt)
	}
	testkit.WaitFor(t, "the renewal wait on the clock", func() bool { n, _ := clock.Pending(); return n == 1 })

	clock.Advance(renewAt.Sub(clock.Now()) - time.Second)
	if n, _ := clock.Pending(); n != 1 || c.ca.Requests(t) != 1 {
		t.Fatalf("a second before the renewal point: %d waits, %d CA requests; want 1 and 1", n, c.ca.Requests(t))
	}
	clock.Advance(time.Second)
	c.out.WaitLast(t, "renewed certificate", func(b messages.CertBundle) bool { return b.Version != b1.Version })
	if n := c.ca.Requests(t); n != 2 {
		t.Fatalf("CA saw %d requests; want 2", n)
	}
}

// The CA is down at start: requests are retried with backoff until it is up.
func TestCADownThenUp(t *testing.T) {
	c := newCASetup(t, time.Hour)
	c.start(t)
	c.health.WaitState(t, messages.Starting, "CreateCertificate at "+c.ca.Addr)
	time.Sleep(600 * time.Millisecond) // several retries
	c.ca.Start(t)
	c.out.WaitLast(t, "certificate once the CA is up", func(b messages.CertBundle) bool { return b.Version != "" })
	c.health.WaitState(t, messages.Ready, "")
	if n := c.ca.Requests(t); n != 1 {
		t.Errorf("CA saw %d requests; want 1 (failures were connection errors)", n)
	}
}

// Renewal failing keeps the old certificate and reports Degraded; recovery
// publishes a new one.
func TestCARenewalFailureKeepsOldCert(t *testing.T) {
	c := newCASetup(t, 3*time.Second)
	c.ca.Start(t)
	c.start(t)
	b1 := c.out.WaitLast(t, "first certificate", func(b messages.CertBundle) bool { return b.Version != "" })
	c.ca.Stop(t)
	c.health.WaitState(t, messages.Degraded, "serving the previous certificate")
	if got, _ := c.out.Get(); got.Version != b1.Version {
		t.Fatal("bundle changed while the CA was down")
	}
	c.ca.Start(t)
	c.out.WaitLast(t, "renewed certificate", func(b messages.CertBundle) bool { return b.Version != b1.Version })
	c.health.WaitState(t, messages.Ready, "")
}

func TestCAWrongTokenReason(t *testing.T) {
	c := newCASetup(t, time.Hour)
	testkit.WriteFile(t, c.cfg.TokenFile, []byte("wrong"))
	c.ca.Start(t)
	c.start(t)
	h := c.health.WaitState(t, messages.Starting, meshca.ErrUnauthenticated.Error())
	if !strings.Contains(h.Reason, "Unauthenticated") {
		t.Errorf("reason %q lacks the gRPC code", h.Reason)
	}
	if !strings.Contains(c.logs.String(), meshca.ErrUnauthenticated.Error()) {
		t.Error("the CA's error is not in the log")
	}
	// The token is read on every call: fixing the file is enough.
	testkit.WriteFile(t, c.cfg.TokenFile, []byte(testToken))
	c.out.WaitLast(t, "certificate after the token is fixed", func(b messages.CertBundle) bool { return b.Version != "" })
}

func TestCAShortChainRejected(t *testing.T) {
	c := newCASetup(t, time.Hour)
	c.cfg.CAAddr = shortChainCA(t, c.ca.Root)
	c.start(t)
	c.health.WaitState(t, messages.Starting, ErrShortChain.Error())
	if _, ok := c.out.Get(); ok {
		t.Fatal("published a certificate without a root")
	}
}

// COMPLIANCE_POLICY=pqc on the CA client (#35): the agent's CA (Go's
// defaults, which offer X25519MLKEM768) issues; a CA offering only
// classical key exchanges is refused at the handshake, where without the
// policy the same CA is reached (and answers its short chain).
func TestCACompliancePolicyPQC(t *testing.T) {
	c := newCASetup(t, time.Hour)
	c.cfg.CompliancePolicy = compliance.PQC
	c.ca.Start(t)
	c.start(t)
	c.out.WaitLast(t, "certificate over a post-quantum handshake", func(b messages.CertBundle) bool { return b.Version != "" })

	classical := []tls.CurveID{tls.X25519, tls.CurveP256, tls.CurveP384}
	for _, policy := range []compliance.Policy{compliance.None, compliance.PQC} {
		t.Run("policy="+string(policy), func(t *testing.T) {
			c := newCASetup(t, time.Hour)
			c.cfg.CompliancePolicy = policy
			c.cfg.CAAddr = shortChainCA(t, c.ca.Root, classical...)
			c.start(t)
			if policy == compliance.None {
				c.health.WaitState(t, messages.Starting, ErrShortChain.Error())
				return
			}
			c.health.WaitState(t, messages.Starting, "handshake failure")
		})
	}
}

func TestCAMissingRootFile(t *testing.T) {
	c := newCASetup(t, time.Hour)
	os.Remove(c.cfg.CARootFile)
	c.start(t)
	c.health.WaitState(t, messages.Starting, "CA_ROOT_CA")
}

func TestCARSAKey(t *testing.T) {
	c := newCASetup(t, time.Hour)
	c.cfg.KeyAlgorithm, c.cfg.PKCS8Key = RSA, false
	c.ca.Start(t)
	c.start(t)
	b := c.out.WaitLast(t, "certificate", func(b messages.CertBundle) bool { return b.Version != "" })
	if !strings.HasPrefix(string(b.KeyPEM), "-----BEGIN RSA PRIVATE KEY-----") {
		t.Fatalf("key is not PKCS#1 RSA")
	}
}

// After a restart of Serve a still-valid certificate is kept, not replaced.
func TestCARestartKeepsValidCert(t *testing.T) {
	c := newCASetup(t, time.Hour)
	c.ca.Start(t)
	s := newService(t, c.cfg, c.out, c.health, c.logs.Logger(), nil, nil)
	first := testkit.Serve(t, s)
	c.out.WaitLast(t, "certificate", func(b messages.CertBundle) bool { return b.Version != "" })
	first.Stop(t)
	second := testkit.Serve(t, s)
	c.health.WaitState(t, messages.Ready, "")
	second.Stop(t)
	if n := c.ca.Requests(t); n != 1 || c.out.Len() != 1 {
		t.Fatalf("after restart: %d CA calls, %d publishes; want 1 and 1", n, c.out.Len())
	}
}

func TestConfigValidateNamesField(t *testing.T) {
	base := testConfig(t, "/")
	cases := map[string]func(*Config){
		"CAAddr":         func(c *Config) { c.CAAddr = "nohostport" },
		"SecretTTL":      func(c *Config) { c.SecretTTL = 0 },
		"GraceRatio":     func(c *Config) { c.GraceRatio = 1.5 },
		"ECCCurve":       func(c *Config) { c.KeyAlgorithm, c.ECCCurve = ECDSA, "P521" },
		"RSAKeySize":     func(c *Config) { c.RSAKeySize = 1024 },
		"KeyAlgorithm":   func(c *Config) { c.KeyAlgorithm = "DSA" },
		"OutputCertsDir": func(c *Config) { c.OutputCertsDir = "relative" },
		"TrustDomain":    func(c *Config) { c.TrustDomain = "" },
		"CertChainFile":  func(c *Config) { c.Source, c.CertChainFile = SourceFiles, "x.pem" },
		"FileDebounce":   func(c *Config) { c.Source, c.FileDebounce = SourceFiles, -1 },
		"CARootFile":     func(c *Config) { c.CARootFile = "" },
		"RetryInitial":   func(c *Config) { c.RetryInitial = 0 },
		"GraceJitter":    func(c *Config) { c.GraceJitter = 0.6 },
		"OutputFileMode": func(c *Config) { c.OutputCertsDir, c.OutputFileMode = "/out", 0o666 },
	}
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	for field, mutate := range cases {
		c := base
		mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: Validate() = %v; want an error naming the field", field, err)
		}
	}
}

// Istio's choice of where each part comes from, by which files exist.
func TestChooseSource(t *testing.T) {
	etc := func(root, name string) string { return filepath.Join(root, testEtcCertsDir, name) }
	spiffe := func(root, name string) string { return filepath.Join(root, testWorkloadCreds, name) }
	all := []string{CertChainFileName, KeyFileName, RootCertFileName}
	for _, tc := range []struct {
		name             string
		files            func(root string) []string
		empty            []string // files written empty
		fileMounted      bool
		outputIsEtcCerts bool
		source           Source
		roots            MeshRootsSource
		dir              string // where the files are read from ("" for none)
		rootFile         string // RootCertFile, when the roots come from a file
	}{
		{name: "no files", source: SourceCA},
		{name: "FILE_MOUNTED_CERTS", fileMounted: true, source: SourceFiles, dir: testEtcCertsDir},
		{name: "etc/certs", files: func(r string) []string {
			return []string{etc(r, CertChainFileName), etc(r, KeyFileName), etc(r, RootCertFileName)}
		},
			source: SourceFiles, dir: testEtcCertsDir},
		{name: "etc/certs certificate only: roots from the CA", files: func(r string) []string { return []string{etc(r, CertChainFileName), etc(r, KeyFileName)} },
			source: SourceFiles, roots: RootsFromCA, dir: testEtcCertsDir},
		{name: "etc/certs certificate only, FILE_MOUNTED_CERTS: no CA, root waited for", fileMounted: true,
			files:  func(r string) []string { return []string{etc(r, CertChainFileName), etc(r, KeyFileName)} },
			source: SourceFiles, dir: testEtcCertsDir},
		{name: "etc/certs root only: certificate from the CA", files: func(r string) []string { return []string{etc(r, RootCertFileName)} },
			source: SourceCA, roots: RootsFromFile, rootFile: testEtcCertsDir + "/" + RootCertFileName},
		{name: "etc/certs root only, FILE_MOUNTED_CERTS", fileMounted: true, files: func(r string) []string { return []string{etc(r, RootCertFileName)} },
			source: SourceFiles, dir: testEtcCertsDir},
		{name: "an empty file is no file", files: func(r string) []string {
			return []string{etc(r, CertChainFileName), etc(r, KeyFileName), etc(r, RootCertFileName)}
		},
			empty: []string{KeyFileName, RootCertFileName}, source: SourceCA},
		{name: "workload-spiffe-credentials win over etc/certs", files: func(r string) []string {
			return []string{etc(r, RootCertFileName), spiffe(r, CertChainFileName), spiffe(r, KeyFileName), spiffe(r, RootCertFileName)}
		}, source: SourceFiles, dir: testWorkloadCreds},
		{name: "etc/certs that is OUTPUT_CERTS is our own output", outputIsEtcCerts: true,
			files: func(r string) []string {
				return []string{etc(r, CertChainFileName), etc(r, KeyFileName), etc(r, RootCertFileName)}
			},
			source: SourceCA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			cfg := testConfig(t, root)
			if tc.outputIsEtcCerts {
				cfg.OutputCertsDir = filepath.Join(root, testEtcCertsDir)
			}
			if tc.files != nil {
				for _, f := range tc.files(root) {
					data := []byte("x")
					if slices.Contains(tc.empty, filepath.Base(f)) {
						data = nil
					}
					testkit.WriteFile(t, f, data)
				}
			}
			got := chooseSource(cfg, root, tc.fileMounted)
			if got.Source != tc.source || got.Roots != tc.roots {
				t.Fatalf("source %v, roots %v; want %v, %v", got.Source, got.Roots, tc.source, tc.roots)
			}
			if tc.dir != "" {
				for _, n := range all {
					if p := filepath.Join(root, tc.dir, n); p != map[string]string{CertChainFileName: got.CertChainFile, KeyFileName: got.KeyFile, RootCertFileName: got.RootCertFile}[n] {
						t.Errorf("%s not read from %s", n, tc.dir)
					}
				}
			}
			if tc.rootFile != "" && got.RootCertFile != filepath.Join(root, tc.rootFile) {
				t.Errorf("RootCertFile %s, want %s", got.RootCertFile, tc.rootFile)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("chosen config invalid: %v", err)
			}
		})
	}
}

// Roots must fit Source: the file roots go with a CA certificate, the CA's
// roots with a file certificate.
func TestConfigValidateRoots(t *testing.T) {
	c := testConfig(t, "/")
	c.Roots = RootsFromCA // with SourceCA
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "Roots") {
		t.Errorf("RootsFromCA with SourceCA: %v", err)
	}
	c.Source, c.Roots = SourceFiles, RootsFromFile
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "Roots") {
		t.Errorf("RootsFromFile with SourceFiles: %v", err)
	}
	c.Source, c.Roots, c.CAAddr = SourceFiles, RootsFromCA, "nohostport"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "CAAddr") {
		t.Errorf("RootsFromCA checks the CA config: %v", err)
	}
}

// The name checked in the CA's certificate is Istio's: CAServerName
// (ISTIOD_SAN for a CA at the discovery address: an istiod reached by IP
// has no IP SAN), else CA_ADDR's host, and localhost stands for
// istiod.istio-system.svc. The end-to-end test on Istio's istiod
// (discoveryAddress 127.0.0.1:15012) found that ISTIOD_SAN was ignored
// here.
func TestCAServerName(t *testing.T) {
	for _, c := range []struct{ addr, san, want string }{
		{"istiod.istio-system.svc:15012", "", "istiod.istio-system.svc"},
		{"127.0.0.1:15012", "istiod.istio-system.svc", "istiod.istio-system.svc"},
		{"127.0.0.1:15012", "", "127.0.0.1"},
		{"localhost:15012", "", "istiod.istio-system.svc"},
		{"[::1]:15012", "", "::1"},
		{"istiod-canary.istio-system.svc:15012", "istiod.istio-system.svc", "istiod.istio-system.svc"},
	} {
		if got := (Config{CAAddr: c.addr, CAServerName: c.san}).caServerName(); got != c.want {
			t.Errorf("CA_ADDR=%s ISTIOD_SAN=%q: server name %q, want %q", c.addr, c.san, got, c.want)
		}
	}
}

// testWorkloadID is the identity of the file-mounted test certificates.
const testWorkloadID = "spiffe://cluster.local/ns/default/sa/test"

// The first failed request at start (the CA not up yet) is not a warning;
// a second in a row is, counted (issue 22: `make run` warned on every
// fresh start).
func TestFirstCAFailureAtStartIsNotAWarning(t *testing.T) {
	c := newCASetup(t, time.Hour) // the CA is never started
	c.start(t)
	c.logs.WaitLine(t, "certificate request failed", "failures_in_a_row=2")
	var failures []string
	for _, l := range strings.Split(c.logs.String(), "\n") {
		if strings.Contains(l, "certificate request failed") {
			failures = append(failures, l)
		}
	}
	if !strings.Contains(failures[0], "level=INFO") || !strings.Contains(failures[0], "CA may still be starting") {
		t.Errorf("first failure logged as %q; want INFO saying the CA may still be starting", failures[0])
	}
	if !strings.Contains(failures[1], "level=WARN") {
		t.Errorf("second failure logged as %q; want WARN", failures[1])
	}
}
