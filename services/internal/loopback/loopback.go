// Package loopback is what the standalone peers (the embedded CA and
// control plane) share: they serve one machine's agent and must never be
// reachable from the network, so Check holds their listen addresses to
// loopback, and Server runs their gRPC server there.
package loopback

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
)

// Check accepts host:port where host is a loopback IP or "localhost" and
// port is a number (0 picks a free port).
func Check(hostPort string) error {
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return fmt.Errorf("%q: %v", hostPort, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%q: port %q is not a number 0-65535", hostPort, port)
	}
	if host == "localhost" {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsLoopback() {
		return fmt.Errorf("%q: must be a loopback address (127.0.0.1, [::1] or localhost)", hostPort)
	}
	return nil
}
