package identitye2e

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	sdsv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/sds"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// agent is certs and sds wired as the tree wires them, in a temp root.
type agent struct {
	root    string
	certCfg certs.Config
	sdsCfg  sds.Config
	bundles *messages.Cell[messages.CertBundle]
	anchors *messages.Cell[messages.TrustAnchors] // what the XDS proxy would send
	health  *testkit.HealthRecorder
	logs    *testkit.LogBuffer
	log     *slog.Logger
	keys    [][]byte // every private key the test wrote or received
	serving []*testkit.Serving
}

func newAgent(t testing.TB) *agent {
	t.Helper()
	root := testkit.ShortTempDir(t, "id")
	a := &agent{root: root, bundles: messages.NewCell[messages.CertBundle](), anchors: messages.NewCell[messages.TrustAnchors](),
		health: &testkit.HealthRecorder{}, logs: &testkit.LogBuffer{}}
	a.log = a.logs.Logger()
	a.certCfg = certs.NewConfig()
	testkit.FillFromTable(t, &a.certCfg)
	a.certCfg.Namespace, a.certCfg.ServiceAccount = "default", "default"
	a.certCfg.CARootFile = filepath.Join(root, "var/run/secrets/istio/root-cert.pem")
	a.certCfg.TokenFile = filepath.Join(root, "var/run/secrets/tokens/istio-token")
	a.sdsCfg = sds.NewConfig(filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket"), a.certCfg.FileDebounce)
	a.sdsCfg.WorkloadIdentitySocketFile = testkit.TableDefault[string](t, "WORKLOAD_IDENTITY_SOCKET_FILE")
	a.sdsCfg.FilesSocketPath = filepath.Join(root, "var/run/secrets/credential-uds/files-socket")
	a.sdsCfg.CRLFile = filepath.Join(root, "var/run/secrets/istio/crl/ca-crl.pem")
	// The OS trust store file-root:system serves is the test's.
	a.sdsCfg.SystemRootFiles = []string{filepath.Join(root, "os/ca-certificates.crt")}
	t.Cleanup(func() {
		a.stop(t)
		a.assertNoKeysLogged(t)
	})
	return a
}

func (a *agent) start(t testing.TB) {
	t.Helper()
	c, err := certs.New(a.certCfg, certs.Inputs{}, certs.Outputs{Certs: a.bundles}, messages.NewRuntime(certs.Name, a.health, nil, nil, a.log))
	if err != nil {
		t.Fatal(err)
	}
	s, err := sds.New(a.sdsCfg, sds.Inputs{Certs: a.bundles, TrustAnchors: a.anchors}, sds.Outputs{}, messages.NewRuntime(sds.Name, a.health, nil, nil, a.log))
	if err != nil {
		t.Fatal(err)
	}
	a.serving = []*testkit.Serving{testkit.Serve(t, c), testkit.Serve(t, s)}
	a.health.WaitService(t, "sds", messages.Ready, "")
}

func (a *agent) stop(t testing.TB) {
	t.Helper()
	for _, s := range a.serving {
		s.Stop(t)
	}
}

// assertNoKeysLogged: no private key, nor any line of one, in the log.
func (a *agent) assertNoKeysLogged(t testing.TB) {
	t.Helper()
	logs := a.logs.String()
	if len(a.keys) == 0 {
		t.Error("no keys were collected: the check would be empty")
	}
	for _, k := range a.keys {
		for _, line := range strings.Split(string(k), "\n") {
			if len(line) >= 32 && !strings.HasPrefix(line, "-----") && strings.Contains(logs, line) {
				t.Fatalf("private key material in the log: %q", line)
			}
		}
	}
	if strings.Contains(logs, "PRIVATE KEY-----") {
		t.Fatal("a PEM private key header in the log")
	}
}

// envoy is an SDS client stream as Envoy opens it.
type envoy struct {
	stream grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]
	resps  *testkit.Receiver[*discoveryv3.DiscoveryResponse]
	a      *agent
	names  []string
	// What nextAll has received, merged as Envoy merges SDS responses, and
	// the names of the secrets in the last response.
	have     map[string]*tlsv3.Secret
	errs     map[string]*status.Status
	lastSent []string
}

func (a *agent) connect(t testing.TB, names ...string) *envoy {
	t.Helper()
	return a.connectAt(t, a.sdsCfg.SocketPath, names...)
}

func (a *agent) connectAt(t testing.TB, socket string, names ...string) *envoy {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := sdsv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() }) // after the receiver's cleanup: cleanups run last first
	e := &envoy{stream: stream, resps: testkit.NewReceiver(t, cancel, stream.Recv), a: a, names: names,
		have: map[string]*tlsv3.Secret{}, errs: map[string]*status.Status{}}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: sds.SecretTypeURL, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	return e
}

// nextAll receives the next response, ACKs it, and returns every secret and
// error received so far on the stream, merged as Envoy merges them.
func (e *envoy) nextAll(t testing.TB) (map[string]*tlsv3.Secret, map[string]*status.Status) {
	t.Helper()
	r := e.resps.Next(t, "a secret pushed")
	e.lastSent = nil
	for _, a := range r.Resources {
		s := &tlsv3.Secret{}
		if err := a.UnmarshalTo(s); err != nil {
			t.Fatal(err)
		}
		if k := s.GetTlsCertificate().GetPrivateKey().GetInlineBytes(); k != nil {
			e.a.keys = append(e.a.keys, k)
		}
		e.have[s.Name] = s
		delete(e.errs, s.Name)
		e.lastSent = append(e.lastSent, s.Name)
	}
	for _, re := range r.ResourceErrors {
		e.errs[re.GetResourceName().GetName()] = status.FromProto(re.GetErrorDetail())
	}
	e.stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: sds.SecretTypeURL, ResourceNames: e.names,
		VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce})
	return e.have, e.errs
}

// until receives responses until ok holds for one, and returns its secrets.
func (e *envoy) until(t testing.TB, what string, ok func(map[string]*tlsv3.Secret, map[string]*status.Status) bool) map[string]*tlsv3.Secret {
	t.Helper()
	for i := 0; i < 50; i++ {
		secrets, errs := e.nextAll(t)
		if ok(secrets, errs) {
			return secrets
		}
	}
	t.Fatalf("no response with %s", what)
	return nil
}

// next receives the next secret, ACKs it, and returns it with its version.
func (e *envoy) next(t testing.TB) (*tlsv3.Secret, string) {
	t.Helper()
	r := e.resps.Next(t, "a secret pushed")
	s := &tlsv3.Secret{}
	if len(r.Resources) != 1 {
		t.Fatalf("%d resources, want 1", len(r.Resources))
	}
	if err := r.Resources[0].UnmarshalTo(s); err != nil {
		t.Fatal(err)
	}
	if k := s.GetTlsCertificate().GetPrivateKey().GetInlineBytes(); k != nil {
		e.a.keys = append(e.a.keys, k)
	}
	e.stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: sds.SecretTypeURL, ResourceNames: e.names,
		VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce})
	return s, r.VersionInfo
}

func (e *envoy) expectNothing(t testing.TB, d time.Duration) {
	t.Helper()
	e.resps.Quiet(t, "no SDS push expected", d)
}

func chainOf(s *tlsv3.Secret) string {
	return string(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
}

func trustedCA(s *tlsv3.Secret) string {
	return string(s.GetValidationContext().GetTrustedCa().GetInlineBytes())
}

// fileAgent is an agent on file-mounted certs in <root>/etc/certs.
func fileAgent(t testing.TB) (*agent, *pki.CA, string) {
	a := newAgent(t)
	issuer := pki.NewRoot(t, "e2e root")
	dir := filepath.Join(a.root, etcCertsDir)
	os.MkdirAll(dir, 0o755)
	a.certCfg = a.chooseSource(true)
	return a, issuer, dir
}

func writeSet(t testing.TB, a *agent, dir string, issuer *pki.CA, chain, key []byte) {
	a.keys = append(a.keys, key)
	testkit.WriteFile(t, filepath.Join(dir, certs.RootCertFileName), issuer.CertPEM)
	testkit.WriteFile(t, filepath.Join(dir, certs.KeyFileName), key)
	testkit.WriteFile(t, filepath.Join(dir, certs.CertChainFileName), chain)
}

func TestFileRotationPushedToEnvoy(t *testing.T) {
	rotations := map[string]func(t *testing.T, dir string, chain, key []byte){
		"plain write": func(t *testing.T, dir string, chain, key []byte) {
			testkit.WriteFile(t, filepath.Join(dir, certs.KeyFileName), key)
			testkit.WriteFile(t, filepath.Join(dir, certs.CertChainFileName), chain)
		},
		"write tmp then rename": func(t *testing.T, dir string, chain, key []byte) {
			for n, d := range map[string][]byte{certs.KeyFileName: key, certs.CertChainFileName: chain} {
				testkit.WriteFile(t, filepath.Join(dir, n+".tmp"), d)
				if err := os.Rename(filepath.Join(dir, n+".tmp"), filepath.Join(dir, n)); err != nil {
					t.Fatal(err)
				}
			}
		},
	}
	for name, rotate := range rotations {
		t.Run(name, func(t *testing.T) {
			a, issuer, dir := fileAgent(t)
			chain1, key1 := issuer.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
			writeSet(t, a, dir, issuer, chain1, key1)
			a.start(t)
			e := a.connect(t, sds.WorkloadKeyCertResourceName)
			s1, v1 := e.next(t)
			if chainOf(s1) != string(chain1) {
				t.Fatal("first secret is not the mounted certificate")
			}
			chain2, key2 := issuer.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
			a.keys = append(a.keys, key2)
			rotate(t, dir, chain2, key2)
			s2, v2 := e.next(t)
			if chainOf(s2) != string(chain2) || v2 == v1 {
				t.Fatalf("pushed secret is not the rotated certificate (version %s -> %s)", v1, v2)
			}
		})
	}
}

func TestFileDataSymlinkSwapPushedToEnvoy(t *testing.T) {
	a, issuer, dir := fileAgent(t)
	gen := func(name string, chain, key []byte) {
		d := filepath.Join(dir, name)
		os.Mkdir(d, 0o755)
		a.keys = append(a.keys, key)
		testkit.WriteFile(t, filepath.Join(d, certs.CertChainFileName), chain)
		testkit.WriteFile(t, filepath.Join(d, certs.KeyFileName), key)
		testkit.WriteFile(t, filepath.Join(d, certs.RootCertFileName), issuer.CertPEM)
		os.Symlink(name, filepath.Join(dir, "..data_tmp"))
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	chain1, key1 := issuer.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
	gen("..1", chain1, key1)
	for _, n := range []string{certs.CertChainFileName, certs.KeyFileName, certs.RootCertFileName} {
		os.Symlink(filepath.Join("..data", n), filepath.Join(dir, n))
	}
	a.start(t)
	e := a.connect(t, sds.WorkloadKeyCertResourceName)
	if s, _ := e.next(t); chainOf(s) != string(chain1) {
		t.Fatal("first secret is not the mounted certificate")
	}
	chain2, key2 := issuer.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
	gen("..2", chain2, key2)
	if s, _ := e.next(t); chainOf(s) != string(chain2) {
		t.Fatal("..data swap not pushed")
	}
}

// A corrupt file or a key that does not match: Envoy keeps the old secret
// (nothing is pushed) and certs reports why. An identical rewrite pushes
// nothing either.
func TestBadOrIdenticalFileUpdateNotPushed(t *testing.T) {
	a, issuer, dir := fileAgent(t)
	chain1, key1 := issuer.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
	writeSet(t, a, dir, issuer, chain1, key1)
	a.start(t)
	e := a.connect(t, sds.WorkloadKeyCertResourceName)
	e.next(t)
	quiet := 3 * a.certCfg.FileDebounce

	testkit.WriteFile(t, filepath.Join(dir, certs.CertChainFileName), []byte("garbage"))
	a.health.WaitService(t, "certs", messages.Degraded, filepath.Join(dir, certs.CertChainFileName))
	e.expectNothing(t, quiet)

	testkit.WriteFile(t, filepath.Join(dir, certs.CertChainFileName), chain1)
	a.health.WaitService(t, "certs", messages.Ready, "")
	_, otherKey := issuer.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
	a.keys = append(a.keys, otherKey)
	testkit.WriteFile(t, filepath.Join(dir, certs.KeyFileName), otherKey)
	a.health.WaitService(t, "certs", messages.Degraded, "does not match the leaf certificate")
	e.expectNothing(t, quiet)

	writeSet(t, a, dir, issuer, chain1, key1) // back to the served content
	a.health.WaitService(t, "certs", messages.Ready, "")
	e.expectNothing(t, quiet)
}

// A short-lived CA certificate is renewed before expiry and pushed on the
// same open stream; a wrong token shows the CA's error in health.
func TestCARenewalPushedOnSameStream(t *testing.T) {
	a := caAgent(t, startCA(t, 4*time.Second))
	a.certCfg.RetryInitial, a.certCfg.RetryMax = 50*time.Millisecond, 500*time.Millisecond
	testkit.WriteFile(t, a.certCfg.TokenFile, []byte("wrong-token"))
	a.start(t)
	a.health.WaitService(t, "certs", messages.Starting, ca.ErrUnauthenticated.Error())

	testkit.WriteFile(t, a.certCfg.TokenFile, []byte(testToken))
	e := a.connect(t, sds.WorkloadKeyCertResourceName)
	s1, v1 := e.next(t)
	b1, _ := a.bundles.Get()
	s2, v2 := e.next(t)
	if v1 == v2 || chainOf(s1) == chainOf(s2) {
		t.Fatal("renewal pushed the same certificate")
	}
	if !time.Now().Before(b1.Expiry) {
		t.Fatalf("renewal arrived at %v, after the first certificate expired (%v)", time.Now(), b1.Expiry)
	}
}

// Istio's file-mounted certificate directories, under the test's root.
const (
	etcCertsDir      = "etc/certs"
	workloadCredsDir = "var/run/secrets/workload-spiffe-credentials"
)

// chooseSource is Istio's choice of certificate source, as cmd makes it.
func (a *agent) chooseSource(fileMountedCerts bool) certs.Config {
	return certs.ChooseSource(a.certCfg, filepath.Join(a.root, etcCertsDir), filepath.Join(a.root, workloadCredsDir), fileMountedCerts)
}
