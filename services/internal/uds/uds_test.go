package uds

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// A socket for a proxy of another group: the socket is 0660 in that group
// and so is its directory's group, so the proxy can reach it; a stale socket
// is replaced, a live one is refused with ErrInUse.
func TestListenForAProxyGroup(t *testing.T) {
	testkit.RequireRoot(t, "chown to another group")
	path := filepath.Join(t.TempDir(), "run", "XDS")
	s := Socket{Path: path, Name: "XDS", Owner: Owner{UID: -1, GID: 1337}, Live: Accepts, Log: testkit.TestLogger(t)}
	lis, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{path: 0o660, filepath.Dir(path): 0o750} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want || fi.Sys().(*syscall.Stat_t).Gid != 1337 {
			t.Errorf("%s: mode %v gid %d, want %v gid 1337", p, fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Gid, want)
		}
	}
	if _, err := s.Listen(); !errors.Is(err, ErrInUse) {
		t.Errorf("second Listen on a live socket = %v, want ErrInUse", err)
	}
	// A killed agent leaves the file behind: the next start replaces it.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	lis.Close()
	lis, err = s.Listen()
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	lis.Close()
}
