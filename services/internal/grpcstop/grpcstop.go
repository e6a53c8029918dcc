// Package grpcstop stops the agent's gRPC servers (SDS, XDS, the embedded
// CA and control plane) the one way all of them need: gracefully, so that
// calls in flight finish, but never past the service's stop timeout, since
// a client that does not hang up would otherwise hold the whole tree's
// shutdown.
package grpcstop

import (
	"time"

	"google.golang.org/grpc"
)

// Within stops srv gracefully until deadline fires, then closes whatever is
// still open. It returns when the server has stopped; forced says whether
// the deadline had to close connections.
func Within(srv *grpc.Server, deadline <-chan time.Time) (forced bool) {
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
		return false
	case <-deadline:
		srv.Stop()
		<-done
		return true
	}
}
