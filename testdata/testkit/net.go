package testkit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Ports for servers that must be told their address before they start are
// picked at random below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range, 32768-60999 by default), where the kernel
// never hands a port out by itself. A port from Listen("127.0.0.1:0") is
// an ephemeral one: closed so that its user can bind it, it could be taken
// in between by the source port of any connection the machine opens, or by
// another test's Listen(":0"), and its user failed with "bind: address
// already in use" (seen in services/envoy's stand-in tests under make
// test). Above 20000: the agent's, Envoy's and the embedded peers' fixed
// ports (15000-15090, 16010, 16012) are below, and a test may run an agent
// on them.
const lowestPort = 20000

// FreeAddr is a loopback TCP address (127.0.0.1:port) that was free a
// moment ago: for a server that must be told its address before it
// starts, or that must come back on the same one.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}

// FreePort is FreeAddr's port.
func FreePort(t testing.TB) int {
	t.Helper()
	ports, err := FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}

// FreePorts are n distinct loopback TCP ports that were free a moment ago:
// each listener stays open until all are chosen, so that no port is handed
// out twice. It takes no testing.TB, so that the benchmark and attack
// drivers (main packages) choose their ports the way the tests do.
func FreePorts(n int) ([]int, error) {
	top := ephemeralLow()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("no free loopback port in %d-%d after %d tries", lowestPort, top-1, tries)
		}
		port := lowestPort + rand.IntN(top-lowestPort)
		l, err := exclusive.Listen(context.Background(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EACCES) {
			continue
		}
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, port)
	}
	return ports, nil
}

// exclusive listens without SO_REUSEADDR, which Go sets on every listener:
// with it on both sides Linux lets a socket bind and listen on a port that
// another socket has bound and does not listen on yet, as the stand-in
// Envoy holds its listeners until its workers start (#36), and the port
// was handed out twice. Without it, any socket bound to the port (or a
// connection of it in TIME_WAIT) makes the port not free.
var exclusive = net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 0)
	})
	return errors.Join(err, serr)
}}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low <= lowestPort+1000 {
		return 32768
	}
	return low
}
