package certs

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// fileSetup is a root with file-mounted certs in etc/certs.
type fileSetup struct {
	pki    *pki.CA
	dir    string
	cfg    Config
	out    *testkit.Recorder[messages.CertBundle]
	health *testkit.HealthRecorder
	logs   *testkit.LogBuffer
	clock  messages.Clock
	reg    prometheus.Registerer
}

func newFileSetup(t *testing.T) *fileSetup {
	root := t.TempDir()
	f := &fileSetup{pki: pki.NewRoot(t, "meshagent test root"), dir: filepath.Join(root, testEtcCertsDir), out: &testkit.Recorder[messages.CertBundle]{},
		health: &testkit.HealthRecorder{}, logs: &testkit.LogBuffer{}}
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f.cfg = chooseSource(testConfig(t, root), root, true)
	f.cfg.FileDebounce = 20 * time.Millisecond
	return f
}

func (f *fileSetup) writeAll(t *testing.T, chain, key []byte) {
	t.Helper()
	testkit.WriteFile(t, filepath.Join(f.dir, RootCertFileName), f.pki.CertPEM)
	testkit.WriteFile(t, filepath.Join(f.dir, KeyFileName), key)
	testkit.WriteFile(t, filepath.Join(f.dir, CertChainFileName), chain)
}

// leaf is a fresh workload certificate from the setup's root.
func (f *fileSetup) leaf(t *testing.T) (chain, key []byte) {
	t.Helper()
	return f.pki.Leaf(t, pki.Leaf{SPIFFE: testWorkloadID, Lifetime: time.Hour})
}

// startLoaded mounts a fresh certificate, starts the service and waits
// for the bundle it publishes first.
func (f *fileSetup) startLoaded(t *testing.T) (chain, key []byte, first messages.CertBundle) {
	t.Helper()
	chain, key = f.leaf(t)
	f.writeAll(t, chain, key)
	f.start(t)
	first = f.out.WaitLast(t, "first bundle", func(b messages.CertBundle) bool { return b.Version != "" })
	return chain, key, first
}

func (f *fileSetup) start(t *testing.T) *testkit.Serving {
	return testkit.Serve(t, newService(t, f.cfg, f.out, f.health, f.logs.Logger(), f.clock, f.reg))
}

func TestFilesInitialLoadAndPlainWriteRotation(t *testing.T) {
	f := newFileSetup(t)
	chain1, key1, b1 := f.startLoaded(t)
	if string(b1.CertChainPEM) != string(chain1) || string(b1.KeyPEM) != string(key1) || string(b1.RootsPEM) != string(f.pki.CertPEM) {
		t.Fatal("published bundle does not hold the files' content")
	}
	f.health.WaitState(t, messages.Ready, "")

	chain2, key2 := f.leaf(t)
	// Plain in-place writes, key first: in between, the pair may not
	// match; the debounce and the final check must end on the new pair.
	testkit.WriteFile(t, filepath.Join(f.dir, KeyFileName), key2)
	testkit.WriteFile(t, filepath.Join(f.dir, CertChainFileName), chain2)
	b2 := f.out.WaitLast(t, "rotated bundle", func(b messages.CertBundle) bool { return string(b.CertChainPEM) == string(chain2) })
	if b2.Version == b1.Version {
		t.Fatal("version unchanged after rotation")
	}
	f.health.WaitState(t, messages.Ready, "")
}

func TestFilesRotationByRename(t *testing.T) {
	f := newFileSetup(t)
	f.startLoaded(t)

	chain2, key2 := f.leaf(t)
	for name, data := range map[string][]byte{KeyFileName: key2, CertChainFileName: chain2} {
		tmp := filepath.Join(f.dir, "."+name+".swp")
		testkit.WriteFile(t, tmp, data)
		if err := os.Rename(tmp, filepath.Join(f.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	f.out.WaitLast(t, "renamed-in bundle", func(b messages.CertBundle) bool { return string(b.CertChainPEM) == string(chain2) })
}

// Kubernetes mounts secrets as name -> ..data/name with ..data a symlink to
// a timestamped directory, and swaps ..data atomically on update.
func TestFilesRotationByDataSymlinkSwap(t *testing.T) {
	f := newFileSetup(t)
	project := func(chain, key []byte) {
		testkit.ProjectVolume(t, f.dir, map[string][]byte{CertChainFileName: chain, KeyFileName: key, RootCertFileName: f.pki.CertPEM})
	}
	chain1, key1 := f.leaf(t)
	project(chain1, key1)
	f.start(t)
	f.out.WaitLast(t, "first bundle", func(b messages.CertBundle) bool { return string(b.CertChainPEM) == string(chain1) })

	chain2, key2 := f.leaf(t)
	project(chain2, key2)
	f.out.WaitLast(t, "bundle after ..data swap", func(b messages.CertBundle) bool { return string(b.CertChainPEM) == string(chain2) })
}

func TestFilesBadUpdateKeepsLastGood(t *testing.T) {
	f := newFileSetup(t)
	chain1, key1, b1 := f.startLoaded(t)
	f.health.WaitState(t, messages.Ready, "")

	// A corrupt chain.
	testkit.WriteFile(t, filepath.Join(f.dir, CertChainFileName), []byte("-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n"))
	h := f.health.WaitState(t, messages.Degraded, filepath.Join(f.dir, CertChainFileName))
	if !strings.Contains(h.Reason, "no PEM certificate") {
		t.Errorf("reason %q does not say what is wrong", h.Reason)
	}

	// A well-formed key that does not belong to the (restored) leaf.
	testkit.WriteFile(t, filepath.Join(f.dir, CertChainFileName), chain1)
	f.health.WaitState(t, messages.Ready, "")
	_, otherKey := f.leaf(t)
	testkit.WriteFile(t, filepath.Join(f.dir, KeyFileName), otherKey)
	h = f.health.WaitState(t, messages.Degraded, "does not match the leaf certificate")
	if !strings.Contains(h.Reason, filepath.Join(f.dir, KeyFileName)) {
		t.Errorf("reason %q does not name the key file", h.Reason)
	}
	if strings.Contains(h.Reason, "PRIVATE KEY-----") || strings.Contains(f.logs.String(), string(otherKey[40:80])) {
		t.Fatal("key material in the health reason or the log")
	}
	if got, _ := f.out.Get(); got.Version != b1.Version {
		t.Fatalf("bad update replaced the bundle: %s -> %s", b1.Version, got.Version)
	}
	if f.out.Len() != 1 {
		t.Fatalf("%d bundles published; want only the first", f.out.Len())
	}

	// Recovery on the next change.
	testkit.WriteFile(t, filepath.Join(f.dir, KeyFileName), key1)
	f.health.WaitState(t, messages.Ready, "")
}

func TestFilesIdenticalRewriteIsNoNewVersion(t *testing.T) {
	f := newFileSetup(t)
	chain1, key1, _ := f.startLoaded(t)
	f.writeAll(t, chain1, key1)
	// The rewrite is seen and re-read ...
	f.logs.WaitLine(t, "certificate files unchanged")
	// ... and publishes nothing.
	if c := f.out.Len(); c != 1 {
		t.Fatalf("identical rewrite published: %d bundles", c)
	}
}

func TestFilesExpiredLeafRejected(t *testing.T) {
	f := newFileSetup(t)
	chain, key := f.leaf(t)
	f.writeAll(t, chain, key)
	f.clock = testkit.FrozenClock{At: time.Now().Add(2 * time.Hour)}
	f.start(t)
	f.health.WaitState(t, messages.Starting, "leaf certificate has expired")
	if _, ok := f.out.Get(); ok {
		t.Fatal("expired certificate published")
	}
}

func TestFilesMissingAtStartThenAppear(t *testing.T) {
	f := newFileSetup(t)
	f.start(t)
	f.health.WaitState(t, messages.Starting, CertChainFileName)
	chain, key := f.leaf(t)
	f.writeAll(t, chain, key)
	f.out.WaitLast(t, "bundle once files appear", func(b messages.CertBundle) bool { return string(b.CertChainPEM) == string(chain) })
	f.health.WaitState(t, messages.Ready, "")
}

// The mount directory itself may appear late.
func TestFilesDirectoryAppearsLate(t *testing.T) {
	f := newFileSetup(t)
	os.RemoveAll(f.dir)
	f.start(t)
	f.health.WaitState(t, messages.Starting, "no usable certificate")
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	chain, key := f.leaf(t)
	f.writeAll(t, chain, key)
	f.out.WaitLast(t, "bundle once the directory appears", func(b messages.CertBundle) bool { return string(b.CertChainPEM) == string(chain) })
}

// A mounted file replaced by something that is not a regular file (here a
// FIFO, which os.ReadFile blocked on for ever) is a bad update naming the
// file: the last good bundle stays, and the next good file is read
// (issue #21).
func TestFilesNotRegularIsABadUpdate(t *testing.T) {
	f := newFileSetup(t)
	_, key1, b1 := f.startLoaded(t)
	f.health.WaitState(t, messages.Ready, "")
	keyFile := filepath.Join(f.dir, KeyFileName)
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(keyFile, 0o600); err != nil {
		t.Fatal(err)
	}
	h := f.health.WaitState(t, messages.Degraded, keyFile)
	testkit.Contains(t, "health reason", h.Reason, "not a regular file (a FIFO)")
	if got, _ := f.out.Get(); got.Version != b1.Version {
		t.Fatalf("bad update replaced the bundle: %s -> %s", b1.Version, got.Version)
	}
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, keyFile, key1)
	f.health.WaitState(t, messages.Ready, "")
}
