package testkit

import (
	"net"
	"testing"
)

// AcceptAndClose accepts every connection on l and closes it at once,
// until l is closed (the end of the test closes it, and waits for the
// accepting goroutine): an open port (or socket) with nothing behind it,
// as a TCP probe or a liveness check sees one.
func AcceptAndClose(t testing.TB, l net.Listener) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
}
