package testkit

import (
	"net"
	"testing"
)

// FreeAddr is a loopback TCP address (127.0.0.1:port) that was free a
// moment ago: for a server that must be told its address before it
// starts, or that must come back on the same one.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return freeTCPAddr(t).String()
}

// FreePort is FreeAddr's port.
func FreePort(t testing.TB) int {
	t.Helper()
	return freeTCPAddr(t).Port
}

func freeTCPAddr(t testing.TB) *net.TCPAddr {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr)
}

// FreePorts are n distinct loopback TCP ports that were free a moment ago:
// each listener stays open until all are chosen, so that no port is handed
// out twice. It takes no testing.TB, so that the benchmark and attack
// drivers (main packages) choose their ports the way the tests do.
func FreePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
