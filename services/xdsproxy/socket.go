package xdsproxy

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// ErrSocketInUse: another server answers on the XDS socket path.
var ErrSocketInUse = errors.New("a live server is already listening on the XDS socket")

// listen prepares the directory, clears a stale socket, refuses to take
// over a live one, and listens with owner-only permissions.
func (s *Service) listen() (net.Listener, error) {
	path := s.cfg.SocketPath
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create XDS socket directory %s: %w", dir, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("XDS socket path %s exists and is not a socket (%s)", path, fi.Mode())
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: %w (another agent?)", path, ErrSocketInUse)
		}
		s.log.Info("removing stale XDS socket", "socket", path)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove stale XDS socket %s: %w", path, err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on XDS socket %s: %w", path, err)
	}
	// The directory is 0750, so nobody else can reach the socket in the
	// moment before the chmod.
	mode := os.FileMode(0o600)
	if s.cfg.SocketGID >= 0 {
		mode = 0o660
	}
	if err := os.Chmod(path, mode); err != nil {
		lis.Close()
		return nil, fmt.Errorf("chmod XDS socket %s: %w", path, err)
	}
	if s.cfg.SocketUID >= 0 || s.cfg.SocketGID >= 0 {
		if err := os.Chown(path, s.cfg.SocketUID, s.cfg.SocketGID); err != nil {
			lis.Close()
			return nil, fmt.Errorf("chown XDS socket %s to %d:%d: %w", path, s.cfg.SocketUID, s.cfg.SocketGID, err)
		}
	}
	return lis, nil
}

// removeSocket is best effort: the listener usually unlinks the socket
// itself, and a leftover one is removed as stale on the next start.
func removeSocket(path string) { _ = os.Remove(path) }
