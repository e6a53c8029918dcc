package sds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshagent/meshagent/services/internal/uds"
)

// Errors Serve fails with when it cannot have its socket.
var (
	// ErrSocketInUse: another server answers on the socket this server
	// must listen on (the files-only socket: another agent?).
	ErrSocketInUse = uds.ErrInUse
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
	live, err := s.socket(envoyPath).LiveOrRemoved()
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
		lis, err := s.socket(s.cfg.FilesSocketPath).Listen()
		return lis, external, err
	}
	if envoyPath != s.cfg.SocketPath {
		return nil, "", fmt.Errorf("WORKLOAD_IDENTITY_SOCKET_FILE=%q: %s: %w", s.cfg.WorkloadIdentitySocketFile, envoyPath, ErrNoWorkloadSocket)
	}
	lis, err = s.socket(s.cfg.SocketPath).Listen()
	return lis, "", err
}

// socket is one of this server's sockets, or the one Envoy is told to use:
// live when a gRPC server answers there.
func (s *Service) socket(path string) uds.Socket {
	return uds.Socket{Path: path, Name: "SDS", Owner: s.cfg.SocketOwner, Live: SocketLive, Log: s.log}
}
