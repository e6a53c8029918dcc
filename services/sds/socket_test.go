package sds

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/uds"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// The socket is owner-only in a 0750 directory, and no TCP listener exists.
func TestSocketPermissionsAndNoTCP(t *testing.T) {
	before := tcpListenInodes(t)
	s := startServer(t)
	fi, err := os.Stat(s.cfg.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want socket 0600", fi.Mode())
	}
	di, _ := os.Stat(filepath.Dir(s.cfg.SocketPath))
	if di.Mode().Perm() != 0o750 {
		t.Fatalf("socket dir mode %v, want 0750", di.Mode().Perm())
	}
	for ino := range tcpListenInodes(t) {
		if !before[ino] && ownSocket(t, ino) {
			t.Fatalf("the SDS server opened a TCP listener (socket inode %s)", ino)
		}
	}
}

// tcpListenInodes returns the inodes of listening TCP sockets in this
// network namespace.
func tcpListenInodes(t *testing.T) map[string]bool {
	out := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Skipf("cannot read %s: %v", f, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) > 9 && fields[3] == "0A" { // LISTEN
				out[fields[9]] = true
			}
		}
	}
	return out
}

func ownSocket(t *testing.T, inode string) bool {
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && l == "socket:["+inode+"]" {
			return true
		}
	}
	return false
}

// A socket left by a server that died is removed and replaced.
func TestStaleSocketRemoved(t *testing.T) {
	s := newServer(t)
	os.MkdirAll(filepath.Dir(s.cfg.SocketPath), 0o750)
	staleSocket(t, s.cfg.SocketPath)
	s.start(t)
	s.logs.WaitLine(t, "removing stale SDS socket", s.cfg.SocketPath)
	s.certs.Send(bundle(1))
	if got := chainOf(decode(t, s.open(t, WorkloadKeyCertResourceName).recv(t))[WorkloadKeyCertResourceName]); got != "chain-1" {
		t.Fatalf("chain %q", got)
	}
	s.stop(t)
	if _, err := os.Stat(s.cfg.SocketPath); !os.IsNotExist(err) {
		t.Fatalf("socket file left behind: %v", err)
	}
}

// staleSocket leaves a socket file nobody listens on: bound, then its
// listener closed without unlinking.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
}

// When a live SDS server answers on the socket Envoy uses (Istio's own name
// or WORKLOAD_IDENTITY_SOCKET_FILE's), this server leaves it alone: it is
// Ready, saying that the external server is in use, and serves file secrets
// only, on the files socket; "default" and "ROOTCA" are refused there.
func TestLiveSocketMeansExternalSDSAndFilesOnly(t *testing.T) {
	istios := testkit.TableDefault[string](t, "WORKLOAD_IDENTITY_SOCKET_FILE")
	for _, file := range []string{istios, "spire-agent.sock"} {
		t.Run(file, func(t *testing.T) {
			s := newServer(t, func(c *Config) { c.WorkloadIdentitySocketFile = file })
			external := filepath.Join(filepath.Dir(s.cfg.SocketPath), file)
			if s.cfg.EnvoySocketPath() != external {
				t.Fatalf("EnvoySocketPath %s, want %s", s.cfg.EnvoySocketPath(), external)
			}
			xdsserver.ExternalSDS(t, external)
			s.start(t)
			h := s.waitHealth(t, messages.Ready, "external SDS server on "+external)
			t.Logf("health: %v %q", h.State, h.Reason)
			if !SocketLive(external) {
				t.Fatal("the external server's socket was taken over or removed")
			}
			if file != istios {
				if _, err := os.Stat(s.cfg.SocketPath); !os.IsNotExist(err) {
					t.Fatalf("listening on %s beside the external server: %v", s.cfg.SocketPath, err)
				}
			}
			s.certs.Send(bundle(1))
			rootsFile := s.write(t, "etc/dr/ca.pem", pki.NewRoot(t, "dr").CertPEM)
			names := []string{FileRootPrefix + rootsFile, WorkloadKeyCertResourceName, RootCertResourceName}
			c := openStream(t, clientAt(t, s.cfg.FilesSocketPath), names...)
			got, errs := c.collect(t, "the file secret and two errors", names, func(s map[string]*tlsv3.Secret, errs map[string]*status.Status) bool {
				return len(s)+len(errs) == 3
			})
			if _, ok := got[names[0]]; !ok || len(got) != 1 {
				t.Fatalf("files socket: %d secrets, want the file secret only", len(got))
			}
			for _, n := range names[1:] {
				st := errs[n]
				if st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), external) {
					t.Errorf("%s on the files socket: %v; want FailedPrecondition naming the external server", n, st)
				}
			}
		})
	}
}

// With no files socket configured, an external SDS server leaves nothing to
// serve: Ready, saying why, and no socket.
func TestExternalSDSWithoutFilesSocket(t *testing.T) {
	s := newServer(t, func(c *Config) { c.FilesSocketPath = "" })
	xdsserver.ExternalSDS(t, s.cfg.SocketPath)
	s.start(t)
	s.waitHealth(t, messages.Ready, "external SDS server on "+s.cfg.SocketPath)
	if _, err := os.Stat(filepath.Join(s.root, testFilesSocketPath)); !os.IsNotExist(err) {
		t.Fatalf("files socket exists: %v", err)
	}
}

// WORKLOAD_IDENTITY_SOCKET_FILE naming a socket nothing answers on is a
// startup error naming it (Envoy would have no SDS server); a dead socket
// there is removed first, as Istio does.
func TestNonDefaultSocketFileWithoutServerFails(t *testing.T) {
	s := newServer(t, func(c *Config) { c.WorkloadIdentitySocketFile = "spire-agent.sock" })
	path := s.cfg.EnvoySocketPath()
	os.MkdirAll(filepath.Dir(path), 0o750)
	staleSocket(t, path)
	err := s.svc.Serve(context.Background())
	if !errors.Is(err, ErrNoWorkloadSocket) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "WORKLOAD_IDENTITY_SOCKET_FILE") {
		t.Fatalf("Serve: %v; want ErrNoWorkloadSocket naming %s and WORKLOAD_IDENTITY_SOCKET_FILE", err, path)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("stale socket not removed: %v", err)
	}
	if _, err := os.Stat(s.cfg.SocketPath); !os.IsNotExist(err) {
		t.Fatalf("listening on %s although Envoy uses %s: %v", s.cfg.SocketPath, path, err)
	}
}

// WORKLOAD_IDENTITY_SOCKET_FILE is a file name; a path is refused, as Istio
// refuses it, before anything is touched: by New, the one check of the
// config (#26).
func TestWorkloadIdentitySocketFileMustBeAName(t *testing.T) {
	for _, bad := range []string{"sub/socket", "../socket", "/var/run/spire.sock", ".."} {
		cfg := testConfig(t, testkit.ShortTempDir(t, "sds"))
		cfg.WorkloadIdentitySocketFile = bad
		_, err := New(cfg, Inputs{Certs: messages.NewCell[messages.CertBundle]()}, Outputs{}, messages.NewRuntime(Name, &testkit.HealthRecorder{}, nil, nil, nil))
		if err == nil || !strings.Contains(err.Error(), "WORKLOAD_IDENTITY_SOCKET_FILE") || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: New returned %v; want an error naming WORKLOAD_IDENTITY_SOCKET_FILE and the value", bad, err)
		}
	}
}

// The files socket is refused when another server answers on it.
func TestLiveFilesSocketRefused(t *testing.T) {
	s := newServer(t)
	xdsserver.ExternalSDS(t, s.cfg.SocketPath)
	xdsserver.ExternalSDS(t, s.cfg.FilesSocketPath)
	err := s.svc.Serve(context.Background())
	if !errors.Is(err, ErrSocketInUse) || !strings.Contains(err.Error(), s.cfg.FilesSocketPath) {
		t.Fatalf("Serve: %v; want ErrSocketInUse naming the files socket", err)
	}
}

// SocketLive is true only for a gRPC server that answers, and never removes
// anything.
func TestSocketLive(t *testing.T) {
	dir := testkit.ShortTempDir(t, "live")
	live := filepath.Join(dir, "live")
	xdsserver.ExternalSDS(t, live)
	dead := filepath.Join(dir, "dead")
	staleSocket(t, dead)
	regular := filepath.Join(dir, "regular")
	os.WriteFile(regular, nil, 0o600)
	notGRPC := filepath.Join(dir, "notgrpc")
	l, err := net.Listen("unix", notGRPC)
	if err != nil {
		t.Fatal(err)
	}
	testkit.AcceptAndClose(t, l)
	for path, want := range map[string]bool{live: true, dead: false, regular: false, notGRPC: false, filepath.Join(dir, "missing"): false} {
		if got := SocketLive(path); got != want {
			t.Errorf("SocketLive(%s) = %v, want %v", filepath.Base(path), got, want)
		}
	}
	if _, err := os.Stat(dead); err != nil {
		t.Errorf("SocketLive removed the dead socket: %v", err)
	}
}

// With a proxy UID/GID configured, the socket belongs to it and is 0660.
func TestSocketChownedToProxy(t *testing.T) {
	testkit.RequireRoot(t, "chown")
	root := testkit.ShortTempDir(t, "sds")
	cfg := testConfig(t, root)
	cfg.SocketOwner = uds.Owner{UID: 1337, GID: 1337}
	health := messages.NewCell[messages.Health]()
	svc := newService(t, cfg, messages.NewCell[messages.CertBundle](), health, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx) }()
	for {
		h, ok, changed := health.Watch()
		if ok && h.State == messages.Ready {
			break
		}
		select {
		case <-changed:
		case err := <-done:
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(cfg.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 1337 || st.Gid != 1337 || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket owner %d:%d mode %v; want 1337:1337 0660", st.Uid, st.Gid, fi.Mode().Perm())
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
