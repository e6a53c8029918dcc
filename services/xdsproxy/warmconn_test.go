package xdsproxy

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// countingListener counts the connections it accepted.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// The proxy connects to the control plane as it starts, before Envoy does,
// and Envoy's first stream opens on that connection: the TCP and TLS
// handshakes are off the start's critical path (#24).
func TestConnectsAheadOfEnvoy(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingListener{Listener: lis}
	silent := serveSilent(t, counted)

	p := startProxy(t, testConfig(tempRoot(t), lis.Addr().String()), proxyOpts{})
	testkit.WaitFor(t, "a connection from the proxy before any Envoy", func() bool { return counted.accepted.Load() > 0 })
	p.clientWith(t, xdsserver.ClientOptions{})
	select {
	case <-silent.got:
	case <-time.After(testkit.Timeout):
		t.Fatal("Envoy's request never reached the control plane")
	}
	if n := counted.accepted.Load(); n != 1 {
		t.Fatalf("the control plane accepted %d connections, want 1: Envoy's stream did not use the one made ahead", n)
	}
}
