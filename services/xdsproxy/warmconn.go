package xdsproxy

import (
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// A connection to the control plane made ahead of the stream that will use
// it (#24). At start, the TCP and TLS handshakes then run while Envoy
// starts, instead of after Envoy's first request; after an outage, the
// probe that found the control plane back hands its connection over, and
// Envoy's reconnection opens its stream on it. One connection at most,
// used once; Istio's agent dials for each of Envoy's streams.

// warmIdle is how long a connection with no stream stays connected
// (gRPC's idle mode; a later stream reconnects it): an agent whose Envoy
// never connects holds no idle connection to the control plane. No timer
// of ours: the streams' connections are closed with their streams.
const warmIdle = 10 * time.Second

// warmConn is the one lock left in the proxy beside messages.Stream's: it
// guards conn alone, which a stream's dial takes, the probe puts and Serve
// drops, from their own goroutines; passing it through the state owner
// would put a network handshake's result on the owner's queue for nothing.
type warmConn struct {
	mu   sync.Mutex
	conn *grpc.ClientConn
}

// put holds c (closing the one held before).
func (w *warmConn) put(c *grpc.ClientConn) {
	w.mu.Lock()
	old := w.conn
	w.conn = c
	w.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
}

// take returns the held connection, if any and usable: one that failed to
// connect is closed instead (a fresh dial may reach a control plane that
// has come up since).
func (w *warmConn) take() *grpc.ClientConn {
	w.mu.Lock()
	c := w.conn
	w.conn = nil
	w.mu.Unlock()
	if c == nil {
		return nil
	}
	switch c.GetState() {
	case connectivity.TransientFailure, connectivity.Shutdown:
		_ = c.Close()
		return nil
	}
	return c
}

// drop closes the held connection, if any.
func (w *warmConn) drop() {
	if c := w.take(); c != nil {
		_ = c.Close()
	}
}

// warmUp connects to the control plane ahead of Envoy's first stream,
// when that connection can be made now: not when it needs the workload
// certificate, or roots that come with it (they arrive later).
func (s *Service) warmUp() {
	if s.cfg.ClientCertificate || s.cfg.Roots == RootsCertBundle {
		return
	}
	c, err := s.newConn()
	if err != nil {
		return // the stream's own dial reports it
	}
	c.Connect()
	s.warm.put(c)
}
