package identitye2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/sds"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

func renameInto(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	testkit.WriteFile(t, tmp, data)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// An Envoy with a sidecar's usual secrets on one stream: its identity
// ("default", "ROOTCA"), the OS trust store for a DestinationRule without
// caCertificates, and a DestinationRule's client certificate and CA files.
// Every change reaches it on that one stream: the DestinationRule's files
// rotated, the CA's CRL appearing, extra trust anchors from the control
// plane, the workload certificate rotated, the OS trust store updated.
func TestEnvoyWithEverySecretKindGetsEveryChange(t *testing.T) {
	a, issuer, dir := fileAgent(t)
	a.certCfg.FileDebounce = 20 * time.Millisecond
	a.sdsCfg.FileDebounce = 20 * time.Millisecond
	chain1, key1 := issuer.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
	writeSet(t, a, dir, issuer, chain1, key1)
	osStore := a.sdsCfg.SystemRootFiles[0]
	osRoot, drCA, extra := pki.NewRoot(t, "e2e root"), pki.NewRoot(t, "e2e root"), pki.NewRoot(t, "e2e root")
	os.MkdirAll(filepath.Dir(osStore), 0o755)
	testkit.WriteFile(t, osStore, osRoot.CertPEM)
	drDir := filepath.Join(a.root, "etc/dr")
	os.MkdirAll(drDir, 0o755)
	drChain, drKey := drCA.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
	a.keys = append(a.keys, drKey)
	testkit.WriteFile(t, filepath.Join(drDir, "cert.pem"), drChain)
	testkit.WriteFile(t, filepath.Join(drDir, "key.pem"), drKey)
	testkit.WriteFile(t, filepath.Join(drDir, "ca.pem"), drCA.CertPEM)
	fileCert := sds.FileCertPrefix + filepath.Join(drDir, "cert.pem") + sds.ResourceSeparator + filepath.Join(drDir, "key.pem")
	fileRoot := sds.FileRootPrefix + filepath.Join(drDir, "ca.pem")
	os.MkdirAll(filepath.Dir(a.sdsCfg.CRLFile), 0o755)
	a.start(t)

	e := a.connect(t, sds.WorkloadKeyCertResourceName, sds.RootCertResourceName, sds.FileRootSystemResourceName, fileCert, fileRoot)
	got := e.until(t, "all five secrets", func(s map[string]*tlsv3.Secret, _ map[string]*status.Status) bool { return len(s) == 5 })
	if chainOf(got[sds.WorkloadKeyCertResourceName]) != string(chain1) || trustedCA(got[sds.RootCertResourceName]) != string(issuer.CertPEM) ||
		trustedCA(got[sds.FileRootSystemResourceName]) != string(osRoot.CertPEM) || chainOf(got[fileCert]) != string(drChain) ||
		trustedCA(got[fileRoot]) != string(drCA.CertPEM) {
		t.Fatal("first secrets are not the files' content")
	}

	drChain2, drKey2 := drCA.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
	a.keys = append(a.keys, drKey2)
	renameInto(t, filepath.Join(drDir, "key.pem"), drKey2)
	renameInto(t, filepath.Join(drDir, "cert.pem"), drChain2)
	e.until(t, "the rotated DestinationRule certificate", func(s map[string]*tlsv3.Secret, _ map[string]*status.Status) bool {
		return s[fileCert] != nil && chainOf(s[fileCert]) == string(drChain2)
	})

	crl := issuer.CRL(t, 1, 4242)
	testkit.WriteFile(t, a.sdsCfg.CRLFile, crl)
	e.until(t, "ROOTCA with the CRL", func(s map[string]*tlsv3.Secret, _ map[string]*status.Status) bool {
		return string(s[sds.RootCertResourceName].GetValidationContext().GetCrl().GetInlineBytes()) == string(crl)
	})

	a.anchors.Send(messages.TrustAnchors{PEM: [][]byte{extra.CertPEM, issuer.CertPEM}, Version: "1"})
	e.until(t, "ROOTCA with the extra anchor", func(s map[string]*tlsv3.Secret, _ map[string]*status.Status) bool {
		return trustedCA(s[sds.RootCertResourceName]) == string(issuer.CertPEM)+string(extra.CertPEM)
	})

	chain2, key2 := issuer.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
	a.keys = append(a.keys, key2)
	renameInto(t, filepath.Join(dir, certs.KeyFileName), key2)
	renameInto(t, filepath.Join(dir, certs.CertChainFileName), chain2)
	e.until(t, "the rotated workload certificate", func(s map[string]*tlsv3.Secret, _ map[string]*status.Status) bool {
		return chainOf(s[sds.WorkloadKeyCertResourceName]) == string(chain2)
	})

	osRoot2 := pki.NewRoot(t, "e2e root")
	renameInto(t, osStore, append(append([]byte{}, osRoot.CertPEM...), osRoot2.CertPEM...))
	e.until(t, "the updated OS trust store", func(s map[string]*tlsv3.Secret, _ map[string]*status.Status) bool {
		return trustedCA(s[sds.FileRootSystemResourceName]) == string(osRoot.CertPEM)+string(osRoot2.CertPEM)
	})
	a.health.WaitService(t, "sds", messages.Ready, "")
}

// A DestinationRule naming a file that is not there: an error for that
// secret on the stream and in health, naming the file; the workload
// identity on the same stream is served, and the file is served once it
// appears.
func TestMissingDestinationRuleFileIsAnErrorForThatSecretOnly(t *testing.T) {
	a, issuer, dir := fileAgent(t)
	a.sdsCfg.FileDebounce = 20 * time.Millisecond
	chain, key := issuer.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
	writeSet(t, a, dir, issuer, chain, key)
	a.start(t)
	missing := filepath.Join(a.root, "etc/dr/ca.pem")
	os.MkdirAll(filepath.Dir(missing), 0o755)
	fileRoot := sds.FileRootPrefix + missing

	e := a.connect(t, sds.WorkloadKeyCertResourceName, fileRoot)
	e.until(t, "the workload certificate beside the error", func(s map[string]*tlsv3.Secret, errs map[string]*status.Status) bool {
		st := errs[fileRoot]
		return chainOf(s[sds.WorkloadKeyCertResourceName]) == string(chain) && st != nil && st.Code() == codes.NotFound && strings.Contains(st.Message(), missing)
	})
	a.health.WaitService(t, "sds", messages.Degraded, missing)

	testkit.WriteFile(t, missing, issuer.CertPEM)
	e.until(t, "the file once it exists", func(s map[string]*tlsv3.Secret, errs map[string]*status.Status) bool {
		return trustedCA(s[fileRoot]) == string(issuer.CertPEM) && len(errs) == 0
	})
	a.health.WaitService(t, "sds", messages.Ready, "")
}

// SPIRE (or another SDS server) already serves the workload identity on the
// socket WORKLOAD_IDENTITY_SOCKET_FILE names: the agent's SDS server leaves
// it alone, says so in its health, and serves DestinationRule files on
// credential-uds/files-socket.
func TestExternalSDSServerInUse(t *testing.T) {
	a, issuer, dir := fileAgent(t)
	chain, key := issuer.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID})
	writeSet(t, a, dir, issuer, chain, key)
	a.sdsCfg.WorkloadIdentitySocketFile = "spire-agent.sock"
	spire := a.sdsCfg.EnvoySocketPath()
	xdsserver.ExternalSDS(t, spire)

	a.start(t)
	a.health.WaitService(t, "sds", messages.Ready, "external SDS server on "+spire)
	if !sds.SocketLive(spire) {
		t.Fatal("the external SDS server's socket is gone")
	}
	caFile := filepath.Join(a.root, "etc/dr/ca.pem")
	os.MkdirAll(filepath.Dir(caFile), 0o755)
	testkit.WriteFile(t, caFile, issuer.CertPEM)
	e := a.connectAt(t, a.sdsCfg.FilesSocketPath, sds.FileRootPrefix+caFile, sds.WorkloadKeyCertResourceName)
	e.until(t, "the file secret, and the identity refused", func(s map[string]*tlsv3.Secret, errs map[string]*status.Status) bool {
		st := errs[sds.WorkloadKeyCertResourceName]
		return trustedCA(s[sds.FileRootPrefix+caFile]) == string(issuer.CertPEM) && st != nil && strings.Contains(st.Message(), spire)
	})
	a.keys = append(a.keys, key)
}
