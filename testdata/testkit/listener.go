package testkit

import (
	"net"
	"testing"
)

// AcceptAndClose accepts every connection on l and closes it at once,
// until the end of the test, which closes l: an open port (or socket)
// with nothing behind it, as a TCP probe or a liveness check sees one.
func AcceptAndClose(t testing.TB, l net.Listener) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
}
