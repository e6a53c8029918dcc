package xdsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/services/internal/uds"
)

// ErrSocketInUse: another server answers on the XDS socket path.
var ErrSocketInUse = uds.ErrInUse

// maxRequestSize bounds a message from Envoy (issue #21: at MaxInt32, a
// 16 MiB request cost the agent ~94 MiB). Envoy's requests are small but
// for two: a Delta stream's first request per type lists every resource
// Envoy holds (initial_resource_versions), and a State of the World EDS
// request names every cluster. Istio budgets about 1 MiB per 10,000
// resources for these (a name like outbound|8080||svc.ns.svc.cluster.local
// and a version): 4 MiB holds some 40,000 resources of one type, and it is
// istiod's own limit (ISTIO_GPRC_MAXRECVMSGSIZE, default 4 MiB), which
// every request goes on to: a larger one would be refused there anyway.
const maxRequestSize = 4 << 20

// listen opens the XDS socket: a stale one is removed, a live one (another
// agent?) is refused with ErrSocketInUse.
func (s *Service) listen() (net.Listener, error) {
	return uds.Socket{Path: s.cfg.SocketPath, Name: "XDS", Owner: s.cfg.SocketOwner, Live: uds.Accepts, Log: s.log}.Listen()
}

// A newer stream replaces the open one (Istio keeps one connection), so
// any client that can reach the socket can cut Envoy's stream. The socket
// is Envoy's user's alone (0600, or 0660 with Envoy's group); in depth,
// a stream may replace another only if it comes from the same uid as the
// one it replaces (issue #21), as the kernel tells it (SO_PEERCRED).

// peerCred is who is at the other end of a connection on the socket, read
// once when it is accepted.
type peerCred struct {
	credentials.CommonAuthInfo
	pid      int32
	uid, gid uint32
}

func (peerCred) AuthType() string { return "unix-peercred" }

func (p peerCred) String() string { return fmt.Sprintf("pid %d uid %d", p.pid, p.uid) }

// peerCredentials is the XDS server's transport "security": none (the
// socket's mode is the access control), plus the peer's credentials as the
// connection's AuthInfo, which gRPC hands to each stream (peer.FromContext).
type peerCredentials struct{}

var errNoPeerCred = errors.New("cannot read the peer's credentials (SO_PEERCRED)")

func (peerCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	p, err := readPeerCred(conn)
	if err != nil {
		return nil, nil, err
	}
	return conn, p, nil
}

func (peerCredentials) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("peerCredentials is for the XDS server only")
}

func (peerCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (c peerCredentials) Clone() credentials.TransportCredentials { return c }

func (peerCredentials) OverrideServerName(string) error { return nil }

// readPeerCred reads SO_PEERCRED of a unix connection.
func readPeerCred(conn net.Conn) (peerCred, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return peerCred{}, fmt.Errorf("%w: a %T is not a unix socket", errNoPeerCred, conn)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return peerCred{}, fmt.Errorf("%w: %v", errNoPeerCred, err)
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return peerCred{}, fmt.Errorf("%w: %v", errNoPeerCred, err)
	}
	if serr != nil {
		return peerCred{}, fmt.Errorf("%w: %v", errNoPeerCred, serr)
	}
	return peerCred{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity},
		pid: cred.Pid, uid: cred.Uid, gid: cred.Gid}, nil
}

// peerOf is the credentials of a stream's client.
func peerOf(ctx context.Context) peerCred {
	if p, ok := peer.FromContext(ctx); ok {
		if c, ok := p.AuthInfo.(peerCred); ok {
			return c
		}
	}
	// Every connection passed the handshake: not reached.
	return peerCred{pid: -1, uid: ^uint32(0), gid: ^uint32(0)}
}

// errReplaced refuses the stream of newer, whose earlier stream current
// replaced: an old Envoy epoch may not take the stream back (#25).
func errReplaced(current, newer peerCred) error {
	return status.Errorf(codes.Unavailable,
		"the agent's XDS socket serves a newer Envoy (pid %d) than pid %d, whose stream it replaced", current.pid, newer.pid)
}

// mayReplace decides whether a stream of newer may replace the open
// stream of current: only one of the same uid may.
func mayReplace(current, newer peerCred) error {
	if current.uid == newer.uid {
		return nil
	}
	return status.Errorf(codes.PermissionDenied,
		"the agent's XDS socket serves one Envoy stream, opened by uid %d (pid %d); a stream from uid %d (pid %d) may not replace it",
		current.uid, current.pid, newer.uid, newer.pid)
}
