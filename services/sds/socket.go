package sds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// Errors Serve fails with when it cannot have its socket.
var (
	// ErrSocketInUse: another server answers on the socket this server
	// must listen on (the files-only socket: another agent?).
	ErrSocketInUse = errors.New("a live server is already listening on the SDS socket")
	// ErrNoWorkloadSocket: WORKLOAD_IDENTITY_SOCKET_FILE names another
	// socket than this server's and nothing answers there, so Envoy would
	// have no SDS server at all (Istio fails the same way).
	ErrNoWorkloadSocket = errors.New("no SDS server answers on the socket WORKLOAD_IDENTITY_SOCKET_FILE names")
)

// probeTimeout bounds the check of an existing socket, as Istio's
// socketHealthCheck does.
const probeTimeout = time.Second

// SocketLive reports whether a gRPC server answers on the unix socket at
// path within a second: Istio's socketHealthCheck (a blocking gRPC dial),
// applied to a path that exists and is not a regular file.
//
// The bootstrap asks it about <root>/var/run/secrets/credential-uds/socket
// (Istio's ./var/run/secrets/credential-uds/socket): a live one sets Envoy's node metadata
// credential: "true". It may also ask about Config.EnvoySocketPath() to know
// before Serve whether an external SDS server will serve the workload
// identity (then this server serves files only). Unlike Istio's checkSocket
// it never removes a dead socket: Serve does that, for its own sockets only.
func SocketLive(path string) bool {
	if fi, err := os.Stat(path); err != nil || fi.Mode().IsRegular() {
		return false
	}
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	conn.Connect()
	for {
		switch s := conn.GetState(); s {
		case connectivity.Ready:
			return true
		case connectivity.TransientFailure, connectivity.Shutdown:
			return false
		default:
			if !conn.WaitForStateChange(ctx, s) {
				return false
			}
		}
	}
}

// openSocket decides, as Istio's agent does at start (agent.go Run), where
// this server serves:
//
//   - a live SDS server on EnvoySocketPath (this server is not running, so
//     it is another one: SPIRE's agent, say) serves the workload identity;
//     this server serves file secrets only, on FilesSocketPath (no socket at
//     all when that is empty), and external says so;
//   - otherwise a dead socket there is removed; and if EnvoySocketPath is not
//     SocketPath, Envoy would connect to nothing: ErrNoWorkloadSocket;
//   - otherwise it listens on SocketPath.
func (s *Service) openSocket() (lis net.Listener, external string, err error) {
	envoyPath := s.cfg.EnvoySocketPath()
	live, err := s.liveOrRemoved(envoyPath)
	if err != nil {
		return nil, "", err
	}
	if live {
		external = fmt.Sprintf("an external SDS server on %s serves the workload identity", envoyPath)
		if s.cfg.FilesSocketPath == "" {
			s.log.Info("external SDS server in use; not serving file secrets (no files socket configured)", "socket", envoyPath)
			return nil, external, nil
		}
		s.log.Info("external SDS server in use; serving file secrets only", "socket", envoyPath, "files_socket", s.cfg.FilesSocketPath)
		lis, err := s.listen(s.cfg.FilesSocketPath)
		return lis, external, err
	}
	if envoyPath != s.cfg.SocketPath {
		return nil, "", fmt.Errorf("WORKLOAD_IDENTITY_SOCKET_FILE=%q: %s: %w", s.cfg.WorkloadIdentitySocketFile, envoyPath, ErrNoWorkloadSocket)
	}
	lis, err = s.listen(s.cfg.SocketPath)
	return lis, "", err
}

// liveOrRemoved reports whether a server answers on path; a socket nobody
// answers on is removed (Istio's checkSocket), anything else there that is
// not a socket is an error.
func (s *Service) liveOrRemoved(path string) (bool, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("SDS socket %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return false, fmt.Errorf("SDS socket path %s exists and is not a socket (%s)", path, fi.Mode())
	}
	if SocketLive(path) {
		return true, nil
	}
	s.log.Info("removing stale SDS socket", "socket", path)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("remove stale SDS socket %s: %w", path, err)
	}
	return false, nil
}

// listen prepares the directory, clears a stale socket, refuses to take over
// a live one, and listens with owner-only permissions.
func (s *Service) listen(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create SDS socket directory %s: %w", dir, err)
	}
	live, err := s.liveOrRemoved(path)
	if err != nil {
		return nil, err
	}
	if live {
		return nil, fmt.Errorf("%s: %w", path, ErrSocketInUse)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on SDS socket %s: %w", path, err)
	}
	// The directory is 0750, so nobody else can reach the socket in the
	// moment before the chmod.
	mode := os.FileMode(0o600)
	if s.cfg.SocketGID >= 0 {
		mode = 0o660
	}
	if err := os.Chmod(path, mode); err != nil {
		lis.Close()
		return nil, fmt.Errorf("chmod SDS socket %s: %w", path, err)
	}
	if s.cfg.SocketUID >= 0 || s.cfg.SocketGID >= 0 {
		if err := os.Chown(path, s.cfg.SocketUID, s.cfg.SocketGID); err != nil {
			lis.Close()
			return nil, fmt.Errorf("chown SDS socket %s to %d:%d: %w", path, s.cfg.SocketUID, s.cfg.SocketGID, err)
		}
	}
	return lis, nil
}

// removeSocket is best effort: the listener usually unlinks the socket
// itself, and a leftover one is removed as stale on the next start.
func removeSocket(path string) { _ = os.Remove(path) }
