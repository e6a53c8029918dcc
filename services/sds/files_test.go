package sds

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// rename writes data to path through a temporary file and a rename, as
// editors and most tools do.
func rename(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// istiod asks for "file-root:system" for every DestinationRule TLS
// origination without caCertificates: the OS trust store, the first of
// Istio's candidate files that exists, as a validation context named exactly
// as asked, with the certificates that parse; pushed again when it changes.
func TestFileRootSystemServesOSTrustStore(t *testing.T) {
	s := startServer(t)
	a, b, c := pki.NewRoot(t, "os root a"), pki.NewRoot(t, "os root b"), pki.NewRoot(t, "os root c")
	junk := []byte("-----BEGIN CERTIFICATE-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n-----END CERTIFICATE-----\n")
	store := s.write(t, s.cfg.SystemRootFiles[1], append(append(append([]byte{}, a.CertPEM...), junk...), b.CertPEM...))

	cl := s.open(t, FileRootSystemResourceName)
	r := cl.recv(t)
	sec := decode(t, r)[FileRootSystemResourceName]
	if sec == nil || sec.GetValidationContext() == nil || len(r.Resources) != 1 {
		t.Fatalf("want one validation context named %q; got %v", FileRootSystemResourceName, r)
	}
	if got := trustedCA(sec); got != string(a.CertPEM)+string(b.CertPEM) {
		t.Fatalf("trusted_ca is not the store's two good certificates:\n%s", got)
	}
	cl.ack(t, r, FileRootSystemResourceName)

	rename(t, store, append(append([]byte{}, a.CertPEM...), c.CertPEM...))
	r = cl.recvUntil(t, "the new trust store", []string{FileRootSystemResourceName}, func(r *discoveryv3.DiscoveryResponse) bool {
		return trustedCA(decode(t, r)[FileRootSystemResourceName]) == string(a.CertPEM)+string(c.CertPEM)
	})
	s.waitHealth(t, messages.Ready, "")
}

// No OS trust store at all is an error for that secret, naming the files
// looked for; the store appearing later is pushed.
func TestFileRootSystemMissingThenAppears(t *testing.T) {
	s := startServer(t)
	os.MkdirAll(filepath.Dir(s.cfg.SystemRootFiles[1]), 0o755)
	names := []string{FileRootSystemResourceName, WorkloadKeyCertResourceName}
	cl := s.open(t, names...)
	s.certs.Send(bundle(1))
	r := cl.recvUntil(t, "the trust store error", names, func(r *discoveryv3.DiscoveryResponse) bool {
		return resourceErrors(r)[FileRootSystemResourceName] != nil
	})
	st := resourceErrors(r)[FileRootSystemResourceName]
	if st.Code() != codes.NotFound || !strings.Contains(st.Message(), s.cfg.SystemRootFiles[0]) || !strings.Contains(st.Message(), s.cfg.SystemRootFiles[1]) {
		t.Fatalf("error %v; want NotFound naming the candidate files", st)
	}
	s.waitHealth(t, messages.Degraded, "no OS trust store")

	root := pki.NewRoot(t, "os root")
	s.write(t, s.cfg.SystemRootFiles[1], root.CertPEM)
	cl.recvUntil(t, "the trust store once it exists", names, func(r *discoveryv3.DiscoveryResponse) bool {
		return trustedCA(decode(t, r)[FileRootSystemResourceName]) == string(root.CertPEM) && len(r.ResourceErrors) == 0
	})
	s.waitHealth(t, messages.Ready, "")
}

// An Envoy subscribing to the workload identity and to DestinationRule file
// secrets on one stream gets them all, and each file change pushed: a
// file-cert rotated by rename (key first: the pair only matches once both
// are written), a file-root rewritten in place.
func TestFileSecretsServedAndPushedOnChange(t *testing.T) {
	s := startServer(t)
	s.certs.Send(bundle(1))
	ca1, ca2 := pki.NewRoot(t, "dr ca 1"), pki.NewRoot(t, "dr ca 2")
	chain1, key1 := ca1.Leaf(t, pki.Leaf{})
	certFile := s.write(t, "etc/dr/cert-chain.pem", chain1)
	keyFile := s.write(t, "etc/dr/key.pem", key1)
	caFile := s.write(t, "etc/dr/ca.pem", ca1.CertPEM)
	fileCert := FileCertPrefix + certFile + ResourceSeparator + keyFile
	fileRoot := FileRootPrefix + caFile
	names := []string{WorkloadKeyCertResourceName, RootCertResourceName, fileCert, fileRoot}

	c := s.open(t, names...)
	got, errs := c.collect(t, "four secrets", names, func(s map[string]*tlsv3.Secret, _ map[string]*status.Status) bool { return len(s) == 4 })
	if chainOf(got[WorkloadKeyCertResourceName]) != "chain-1" || trustedCA(got[RootCertResourceName]) != "roots-1" ||
		chainOf(got[fileCert]) != string(chain1) || string(got[fileCert].GetTlsCertificate().GetPrivateKey().GetInlineBytes()) != string(key1) ||
		trustedCA(got[fileRoot]) != string(ca1.CertPEM) || len(errs) != 0 {
		t.Fatalf("first secrets: %d secrets, errors %v", len(got), errs)
	}

	chain2, key2 := ca1.Leaf(t, pki.Leaf{})
	rename(t, keyFile, key2)
	rename(t, certFile, chain2)
	c.recvUntil(t, "the rotated file-cert", names, func(r *discoveryv3.DiscoveryResponse) bool {
		s := decode(t, r)[fileCert]
		return chainOf(s) == string(chain2) && string(s.GetTlsCertificate().GetPrivateKey().GetInlineBytes()) == string(key2)
	})

	if err := os.WriteFile(caFile, ca2.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	c.recvUntil(t, "the rewritten file-root", names, func(r *discoveryv3.DiscoveryResponse) bool {
		return trustedCA(decode(t, r)[fileRoot]) == string(ca2.CertPEM)
	})
	s.logs.WaitLine(t, "read secret from file", "name="+fileRoot)
}

// A missing file, a key that does not belong to its certificate, a CA file
// with no certificate: each is an error for that secret only, with a status
// naming the secret and the file, in the log and in Health. The stream
// stays up, and a file fixed later is pushed.
func TestMissingOrBadFilesAreErrorsForThoseSecretsOnly(t *testing.T) {
	s := startServer(t)
	s.certs.Send(bundle(1))
	ca := pki.NewRoot(t, "dr ca")
	chain, _ := ca.Leaf(t, pki.Leaf{})
	_, otherKey := ca.Leaf(t, pki.Leaf{})
	certFile := s.write(t, "etc/dr/cert-chain.pem", chain)
	keyFile := s.write(t, "etc/dr/key.pem", otherKey)
	garbage := s.write(t, "etc/dr/garbage.pem", []byte("not a certificate"))
	missing := filepath.Join(s.root, "etc/dr/missing.pem")
	mismatched := FileCertPrefix + certFile + ResourceSeparator + keyFile
	names := []string{WorkloadKeyCertResourceName, FileRootPrefix + missing, mismatched, FileRootPrefix + garbage}

	c := s.open(t, names...)
	got, errs := c.collect(t, "the workload certificate and three errors", names, func(s map[string]*tlsv3.Secret, errs map[string]*status.Status) bool {
		return len(s) == 1 && len(errs) == 3
	})
	if chainOf(got[WorkloadKeyCertResourceName]) != "chain-1" {
		t.Fatal("workload certificate not served beside the errors")
	}
	for name, want := range map[string]struct {
		code  codes.Code
		parts []string
	}{
		names[1]: {codes.NotFound, []string{missing, "no such file"}},
		names[2]: {codes.FailedPrecondition, []string{certFile, keyFile, "not a key pair"}},
		names[3]: {codes.FailedPrecondition, []string{garbage, "no usable CA certificate"}},
	} {
		st := errs[name]
		if st.Code() != want.code || !containsAll(st.Message(), append(want.parts, `"`+name+`"`)...) {
			t.Errorf("%s: %v; want %v naming the secret and %q", name, st, want.code, want.parts)
		}
		s.logs.WaitLine(t, "cannot serve secret from file", "name="+name)
	}
	h := s.waitHealth(t, messages.Degraded, missing)
	if !containsAll(h.Reason, garbage, keyFile) {
		t.Errorf("health reason %q does not name every bad file", h.Reason)
	}

	s.write(t, missing, ca.CertPEM)
	c.recvUntil(t, "the file that appeared", names, func(r *discoveryv3.DiscoveryResponse) bool {
		return trustedCA(decode(t, r)[names[1]]) == string(ca.CertPEM) && resourceErrors(r)[names[1]] == nil
	})
	s.certs.Send(bundle(2))
	c.recvUntil(t, "the next workload certificate", names, func(r *discoveryv3.DiscoveryResponse) bool {
		return chainOf(decode(t, r)[WorkloadKeyCertResourceName]) == "chain-2"
	})
}

// A file secret that turns bad keeps its last good content (Envoy keeps it,
// and a new stream gets it too) with the error beside it, until the file is
// good again.
func TestBadFileUpdateKeepsLastGoodSecret(t *testing.T) {
	s := startServer(t)
	ca, caFile, name := s.fileRoot(t)
	c := s.open(t, name)
	c.ack(t, c.recv(t), name)

	rename(t, caFile, []byte("garbage"))
	r := c.recvUntil(t, "the error", []string{name}, func(r *discoveryv3.DiscoveryResponse) bool { return len(r.ResourceErrors) == 1 })
	if trustedCA(decode(t, r)[name]) != string(ca.CertPEM) {
		t.Fatal("the last good secret is not kept beside the error")
	}
	s.waitHealth(t, messages.Degraded, caFile)
	fetched, err := s.client(t).FetchSecrets(context.Background(), &discoveryv3.DiscoveryRequest{ResourceNames: []string{name}})
	if err != nil || trustedCA(decode(t, fetched)[name]) != string(ca.CertPEM) {
		t.Fatalf("fetch while bad: %v %v", fetched, err)
	}

	rename(t, caFile, ca.CertPEM)
	c.recvUntil(t, "the error cleared", []string{name}, func(r *discoveryv3.DiscoveryResponse) bool { return len(r.ResourceErrors) == 0 })
	s.waitHealth(t, messages.Ready, "")
}

// File secrets are read while some stream wants them: after the last
// stream asking for a broken file has gone, it no longer degrades Health.
// Two streams share one file secret.
func TestFileSecretsHeldPerStream(t *testing.T) {
	s := startServer(t)
	_, caFile, name := s.fileRoot(t)
	first, second := s.open(t, name), s.open(t, name)
	first.ack(t, first.recv(t), name)
	second.ack(t, second.recv(t), name)

	first.cancel()
	ca2 := pki.NewRoot(t, "dr ca 2")
	rename(t, caFile, ca2.CertPEM)
	second.recvUntil(t, "the change, with one stream left", []string{name}, func(r *discoveryv3.DiscoveryResponse) bool {
		return trustedCA(decode(t, r)[name]) == string(ca2.CertPEM)
	})

	rename(t, caFile, []byte("garbage"))
	s.waitHealth(t, messages.Degraded, caFile)
	second.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: SecretTypeURL}) // unsubscribe everything
	s.waitHealth(t, messages.Ready, "")
}

// FetchSecrets and DeltaSecrets serve file secrets too.
func TestFetchAndDeltaServeFileSecrets(t *testing.T) {
	s := startServer(t)
	ca, caFile, name := s.fileRoot(t)

	r, err := s.client(t).FetchSecrets(context.Background(), &discoveryv3.DiscoveryRequest{ResourceNames: []string{name}})
	if err != nil || trustedCA(decode(t, r)[name]) != string(ca.CertPEM) {
		t.Fatalf("fetch: %v %v", r, err)
	}
	_, err = s.client(t).FetchSecrets(context.Background(), &discoveryv3.DiscoveryRequest{ResourceNames: []string{FileRootPrefix + caFile + ".missing"}})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), caFile+".missing") {
		t.Fatalf("fetch of a missing file: %v", err)
	}

	stream := s.openDelta(t)
	stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: SecretTypeURL, ResourceNamesSubscribe: []string{name, FileRootPrefix + "/nope.pem"}})
	d, err := stream.Recv()
	if err != nil || len(d.Resources) != 1 || d.Resources[0].Name != name || len(d.ResourceErrors) != 1 ||
		d.ResourceErrors[0].GetResourceName().GetName() != FileRootPrefix+"/nope.pem" {
		t.Fatalf("delta: %v %v", d, err)
	}
	stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: SecretTypeURL, ResponseNonce: d.Nonce})
	ca2 := pki.NewRoot(t, "dr ca 2")
	rename(t, caFile, ca2.CertPEM)
	d, err = stream.Recv()
	if err != nil || len(d.Resources) != 1 || len(d.ResourceErrors) != 0 {
		t.Fatalf("delta push: %v %v", d, err)
	}
}

// Kubernetes mounts a secret as name -> ..data/name, with ..data a symlink
// to a timestamped directory swapped atomically on update.
func TestFileSecretFollowsDataSymlinkSwap(t *testing.T) {
	s := startServer(t)
	dir := filepath.Join(s.root, "etc/dr")
	project := func(ca []byte) { testkit.ProjectVolume(t, dir, map[string][]byte{"ca.pem": ca}) }
	ca1, ca2, ca3 := pki.NewRoot(t, "one"), pki.NewRoot(t, "two"), pki.NewRoot(t, "three")
	project(ca1.CertPEM)
	name := FileRootPrefix + filepath.Join(dir, "ca.pem")
	c := s.open(t, name)
	if got := trustedCA(decode(t, c.recv(t))[name]); got != string(ca1.CertPEM) {
		t.Fatal("first secret is not the mounted file")
	}
	project(ca2.CertPEM)
	c.recvUntil(t, "the swapped file", []string{name}, func(r *discoveryv3.DiscoveryResponse) bool {
		return trustedCA(decode(t, r)[name]) == string(ca2.CertPEM)
	})
	project(ca3.CertPEM)
	c.recvUntil(t, "the second swap", []string{name}, func(r *discoveryv3.DiscoveryResponse) bool {
		return trustedCA(decode(t, r)[name]) == string(ca3.CertPEM)
	})
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// Files that are not regular files, or too large, named by a client: each
// is a FailedPrecondition for that secret only, naming the secret, the file
// and why, and the agent never reads them (os.ReadFile of /dev/zero read
// 2 GiB in 2 s and the kernel killed the agent; a FIFO blocked the store
// for ever: issue #21). The other secrets of the stream, and another
// client's, are served.
func TestUnreadableFilesAreErrorsForThoseSecretsOnly(t *testing.T) {
	s := startServer(t)
	s.certs.Send(bundle(1))
	fifo := filepath.Join(s.root, "etc/dr/fifo.pem")
	if err := os.MkdirAll(filepath.Dir(fifo), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ca := pki.NewRoot(t, "dr ca")
	// Valid PEM, but more than the bound: one certificate repeated.
	huge := s.write(t, "etc/dr/huge.pem", bytes.Repeat(ca.CertPEM, boundedfile.MaxPEM/len(ca.CertPEM)+1))
	names := []string{
		WorkloadKeyCertResourceName,
		FileRootPrefix + "/dev/zero",
		FileCertPrefix + "/dev/urandom" + ResourceSeparator + "/dev/zero",
		FileRootPrefix + fifo,
		FileRootPrefix + huge,
	}
	c := s.open(t, names...)
	got, errs := c.collect(t, "the workload certificate and four errors", names, func(s map[string]*tlsv3.Secret, errs map[string]*status.Status) bool {
		return len(s) == 1 && len(errs) == 4
	})
	if chainOf(got[WorkloadKeyCertResourceName]) != "chain-1" {
		t.Fatal("workload certificate not served beside the errors")
	}
	for name, parts := range map[string][]string{
		names[1]: {"/dev/zero", "not a regular file (a character device)"},
		names[2]: {"/dev/urandom", "not a regular file (a character device)"},
		names[3]: {fifo, "not a regular file (a FIFO)"},
		names[4]: {huge, "file too large", "more than 1048576"},
	} {
		st := errs[name]
		if st.Code() != codes.FailedPrecondition || !containsAll(st.Message(), append(parts, `"`+name+`"`)...) {
			t.Errorf("%s: %v; want FailedPrecondition naming the secret and %q", name, st, parts)
		}
	}

	// Another client, at the same time, is served.
	_, _, name := s.fileRoot(t)
	other := s.open(t, name)
	other.collect(t, "a good file secret for another client", []string{name}, func(s map[string]*tlsv3.Secret, errs map[string]*status.Status) bool {
		return len(s) == 1 && trustedCA(s[name]) != ""
	})
}
