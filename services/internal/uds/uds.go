// Package uds opens the agent's unix-domain sockets (the SDS and XDS
// sockets Envoy connects to) the one way both need: the directory made
// private, a stale socket left by a killed agent removed, a live one never
// taken over, and the socket never world-accessible.
package uds

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Owner is who the socket is chowned to: the proxy's UID/GID (Istio's 1337)
// when the agent runs as root and Envoy does not. A negative ID is left
// alone. The socket is 0600, or 0660 when a GID is given.
type Owner struct {
	UID int
	GID int
}

// Unowned leaves the socket's owner as the agent's.
var Unowned = Owner{UID: -1, GID: -1}

// ErrInUse: a live server already answers on the socket (another agent?).
var ErrInUse = errors.New("a live server is already listening on the socket")

// Socket is one socket of a service: its path, the name its errors and
// log lines give it ("SDS", "XDS"), and how to tell a live server there
// from a dead socket file.
type Socket struct {
	Path  string
	Name  string
	Owner Owner
	// Live reports whether a server answers on the path.
	Live func(path string) bool
	Log  *slog.Logger
}

// LiveOrRemoved reports whether a server answers on the socket; a socket
// nobody answers on is removed (Istio's checkSocket), anything there that is
// not a socket is an error.
func (s Socket) LiveOrRemoved() (bool, error) {
	fi, err := os.Lstat(s.Path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s socket %s: %w", s.Name, s.Path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return false, fmt.Errorf("%s socket path %s exists and is not a socket (%s)", s.Name, s.Path, fi.Mode())
	}
	if s.Live(s.Path) {
		return true, nil
	}
	s.Log.Info("removing stale "+s.Name+" socket", "socket", s.Path)
	if err := os.Remove(s.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("remove stale %s socket %s: %w", s.Name, s.Path, err)
	}
	return false, nil
}

// Listen prepares the directory, clears a stale socket, refuses to take over
// a live one (ErrInUse), and listens with the owner's permissions.
func (s Socket) Listen() (net.Listener, error) {
	dir := filepath.Dir(s.Path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create %s socket directory %s: %w", s.Name, dir, err)
	}
	// A proxy of another user must be able to reach the socket through its
	// 0750 directory: the directory joins the proxy's group (an agent as
	// root with Envoy as 1337, on a VM or with DNS on port 53).
	if s.Owner.GID >= 0 {
		if err := os.Chown(dir, -1, s.Owner.GID); err != nil {
			return nil, fmt.Errorf("chown %s socket directory %s to group %d: %w", s.Name, dir, s.Owner.GID, err)
		}
	}
	live, err := s.LiveOrRemoved()
	if err != nil {
		return nil, err
	}
	if live {
		return nil, fmt.Errorf("%s socket %s: %w", s.Name, s.Path, ErrInUse)
	}
	lis, err := net.Listen("unix", s.Path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s socket %s: %w", s.Name, s.Path, err)
	}
	// The directory is 0750, so nobody else can reach the socket in the
	// moment before the chmod.
	mode := os.FileMode(0o600)
	if s.Owner.GID >= 0 {
		mode = 0o660
	}
	if err := os.Chmod(s.Path, mode); err != nil {
		lis.Close()
		return nil, fmt.Errorf("chmod %s socket %s: %w", s.Name, s.Path, err)
	}
	if s.Owner.UID >= 0 || s.Owner.GID >= 0 {
		if err := os.Chown(s.Path, s.Owner.UID, s.Owner.GID); err != nil {
			lis.Close()
			return nil, fmt.Errorf("chown %s socket %s to %d:%d: %w", s.Name, s.Path, s.Owner.UID, s.Owner.GID, err)
		}
	}
	// Checked, not assumed: whoever can reach the socket can ask for any
	// secret (SDS) or cut Envoy's stream (XDS), issue #21. A file system
	// that ignores the chmod (some FUSE and 9p mounts) must not leave an
	// open socket behind.
	if fi, err := os.Lstat(s.Path); err != nil || fi.Mode().Perm() != mode {
		lis.Close()
		if err == nil {
			err = fmt.Errorf("its mode is %v after a chmod to %v", fi.Mode().Perm(), mode)
		}
		return nil, fmt.Errorf("%s socket %s: %w", s.Name, s.Path, err)
	}
	return lis, nil
}

// Remove is best effort: the listener usually unlinks the socket itself, and
// a leftover one is removed as stale on the next start.
func Remove(path string) { _ = os.Remove(path) }

// Accepts is a Live check for any server: something accepts a connection on
// the socket within a second.
func Accepts(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
