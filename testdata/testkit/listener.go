package testkit

import (
	"crypto/tls"
	"net"
	"testing"
)

// AcceptAndClose accepts every connection on l and closes it at once,
// until l is closed (the end of the test closes it, and waits for the
// accepting goroutine): an open port (or socket) with nothing behind it,
// as a TCP probe or a liveness check sees one. On a TLS listener each
// connection finishes its handshake first, so that a client's dial, which
// checks the server's certificate, succeeds.
func AcceptAndClose(t testing.TB, l net.Listener) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if tc, ok := c.(*tls.Conn); ok {
				_ = tc.Handshake()
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
}

// ServeConns accepts every connection on l until l is closed, and runs
// handle on each in a goroutine of its own, closing the connection when
// handle returns: a test's server of one small exchange per connection.
func ServeConns(l net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}
