package main

// The ports the agent and its Envoy will listen on are tried once at start
// (#21): a port another process holds used to show as ~60 warnings and an
// exit 1 blaming Envoy, or as a status server retrying for ever while the
// other process answered kubelet's probes. Each port is bound and released
// at once, the way its owner will bind it; one another process listens on
// is a configuration error (exit 2) naming the port, what it is for and,
// when /proc says, the process that holds it. Envoy's listeners from the control plane (15001,
// 15006, the services' ports) are not checked: the control plane names them.

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
)

// portUse is one port the agent or its Envoy binds, as it binds it.
type portUse struct {
	network string // "tcp" or "udp"
	addr    string // host:port; an empty host is every address
	what    string // who binds it, and the setting that chose it
}

// listenPorts are the ports cfg's services and its Envoy bind at start.
func listenPorts(cfg *config.Plan) []portUse {
	var uses []portUse
	tc := cfg.Tree
	if tc.Status != nil {
		uses = append(uses, portUse{"tcp", tc.Status.Addr, "the agent's status server (ProxyConfig statusPort)"})
	}
	if e := tc.Envoy; e != nil {
		wildcard := "0.0.0.0"
		if e.Args.IPv6 {
			wildcard = "::"
		}
		uses = append(uses, portUse{"tcp", e.AdminAddr, "Envoy's admin API (ProxyConfig proxyAdminPort)"})
		for _, l := range []struct {
			port int
			what string
		}{
			{e.Bootstrap.EnvoyStatusPort, "Envoy's readiness listener (ENVOY_STATUS_PORT)"},
			{e.Bootstrap.EnvoyPrometheusPort, "Envoy's Prometheus listener (ENVOY_PROMETHEUS_PORT)"},
			{e.Bootstrap.SecureMetricsPort, "Envoy's secure metrics listener (ENVOY_SECURE_METRICS_PORT)"},
			{e.Bootstrap.SecureMergedMetricsPort, "Envoy's secure merged metrics listener (ENVOY_SECURE_MERGED_METRICS_PORT)"},
		} {
			if l.port != 0 { // on the wildcard address of its family, as Envoy's bootstrap listeners
				uses = append(uses, portUse{"tcp", net.JoinHostPort(wildcard, strconv.Itoa(l.port)), l.what})
			}
		}
	}
	if tc.DNS != nil {
		for _, network := range []string{"udp", "tcp"} {
			uses = append(uses, portUse{network, tc.DNS.Listen, "the DNS proxy (DNS_PROXY_ADDR)"})
		}
	}
	if tc.ControlPlane != nil {
		uses = append(uses, portUse{"tcp", tc.ControlPlane.Listen, "the embedded control plane (--controlplane-listen)"})
	}
	if tc.CA != nil {
		uses = append(uses, portUse{"tcp", tc.CA.Listen, "the embedded CA (--ca-listen)"})
	}
	return uses
}

// checkPorts binds and releases each port; every port another process
// listens on is in the error. A port in use with no listener on it is the
// local port of a connection, which goes away (only ports of the ephemeral
// range, which tests use): left to the service's retries, as other bind
// errors are, whose own messages say more.
func checkPorts(uses []portUse) error {
	var errs []error
	for _, u := range uses {
		if err := tryBind(u.network, u.addr); !errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		port, ok := portOf(u.addr)
		if !ok {
			continue
		}
		inodes := listenerInodes(u.network, port)
		if len(inodes) == 0 {
			continue
		}
		holder := ""
		if pid := socketOwner(inodes); pid > 0 { // another user's process: readable by root only
			holder = ", by " + describePID(pid)
		}
		errs = append(errs, fmt.Errorf("port %s/%s for %s is in use%s", u.addr, u.network, u.what, holder))
	}
	return errors.Join(errs...)
}

func tryBind(network, addr string) error {
	if network == "udp" {
		pc, err := net.ListenPacket(network, addr)
		if err == nil {
			pc.Close()
		}
		return err
	}
	l, err := net.Listen(network, addr)
	if err == nil {
		l.Close()
	}
	return err
}

func portOf(addr string) (int, bool) {
	_, text, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, false
	}
	port, err := strconv.Atoi(text)
	return port, err == nil
}

// listenerInodes are the inodes of the sockets listening on port: in
// /proc/net/{tcp,tcp6} those in state LISTEN, in /proc/net/{udp,udp6} the
// unconnected ones (a UDP client's socket is connected, or bound to no port
// of ours).
func listenerInodes(network string, port int) map[string]bool {
	listening := "0A" // TCP_LISTEN
	if network == "udp" {
		listening = "07" // TCP_CLOSE: an unconnected UDP socket
	}
	inodes := map[string]bool{}
	for _, file := range []string{"/proc/net/" + network, "/proc/net/" + network + "6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != listening {
				continue
			}
			_, hexPort, ok := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && int(p) == port {
				inodes[fields[9]] = true
			}
		}
		f.Close()
	}
	return inodes
}

// socketOwner is the PID of a process with one of the socket inodes open,
// or 0.
func socketOwner(inodes map[string]bool) int {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, proc := range procs {
		pid, err := strconv.Atoi(filepath.Base(proc))
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(proc + "/fd")
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(proc + "/fd/" + fd.Name())
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
				return pid
			}
		}
	}
	return 0
}
