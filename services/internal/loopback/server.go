package loopback

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/services/internal/grpcstop"
)

// Server runs a standalone peer's gRPC server on its loopback address, for
// one Serve of the peer at a time: Start, then Stop when the peer's Serve
// ends (or Failed fires). Addr may be read from any goroutine.
type Server struct {
	// addr is the address served, with the port chosen when the
	// configuration asks for port 0; nil when not serving.
	addr atomic.Pointer[string]

	srv    *grpc.Server
	done   chan struct{} // closed when srv.Serve returned
	err    error         // what srv.Serve returned, once done is closed
	listen string        // the address listened on, for errors
}

// Addr is the address the server listens on, "" when it is not listening:
// for a caller that asked for port 0.
func (s *Server) Addr() string {
	if a := s.addr.Load(); a != nil {
		return *a
	}
	return ""
}

// Start listens on hostPort (TCP) and serves srv there in its own
// goroutine.
func (s *Server) Start(srv *grpc.Server, hostPort string) error {
	lis, err := net.Listen("tcp", hostPort)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", hostPort, err)
	}
	addr := lis.Addr().String()
	s.srv, s.listen, s.err = srv, addr, nil
	s.done = make(chan struct{})
	s.addr.Store(&addr)
	go func() {
		s.err = srv.Serve(lis)
		close(s.done)
	}()
	return nil
}

// Failed is closed when the server stopped serving by itself (Err says
// why); the peer must still Stop it.
func (s *Server) Failed() <-chan struct{} { return s.done }

// Stop lets calls in flight finish until deadline fires, then closes what
// is still open (forced says it had to), waits until the server has
// stopped, and withdraws the address.
func (s *Server) Stop(deadline <-chan time.Time) (forced bool) {
	forced = grpcstop.Within(s.srv, deadline)
	<-s.done
	s.addr.Store(nil)
	return forced
}

// Err is why the server stopped serving, nil when Stop stopped it. It is
// read after Failed or Stop.
func (s *Server) Err() error {
	select {
	case <-s.done:
	default:
		return nil
	}
	// A Stop before the serving goroutine got to Serve makes Serve return
	// ErrServerStopped: stopped by Stop, not a failure.
	if s.err == nil || errors.Is(s.err, grpc.ErrServerStopped) {
		return nil
	}
	return fmt.Errorf("serve on %s: %w", s.listen, s.err)
}
