package xdsproxy

import (
	"net"

	"github.com/meshagent/meshagent/services/internal/uds"
)

// ErrSocketInUse: another server answers on the XDS socket path.
var ErrSocketInUse = uds.ErrInUse

// listen opens the XDS socket: a stale one is removed, a live one (another
// agent?) is refused with ErrSocketInUse.
func (s *Service) listen() (net.Listener, error) {
	return uds.Socket{Path: s.cfg.SocketPath, Name: "XDS", Owner: s.cfg.SocketOwner, Live: uds.Accepts, Log: s.log}.Listen()
}
