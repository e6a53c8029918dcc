package main

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"syscall"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
)

// hostInputs is everything the configuration reads from the host besides
// flags and files under --root: production fills it from the real host
// (realHost), tests by hand. Nothing below cmd reads the host itself.
type hostInputs struct {
	// env is the process environment, read by config.Env's names, each read
	// counted (#26).
	env *config.Reader
	// euid is the agent's effective uid (Envoy runs as 1337 only when the
	// agent is root and DNS is served on :53, as in Istio).
	euid int
	// interfaceAddrs lists the host's addresses in interface order: the
	// node's IPs after INSTANCE_IP, and istio-iptables' IPv6 decision.
	interfaceAddrs func() ([]netip.Prefix, error)
	// lookupUID resolves a user name ($ENVOY_USER, istio-iptables' default
	// --proxy-uid).
	lookupUID func(name string) (string, error)
	// hostname is the host's name (a VM's POD_NAME by default, as
	// istio-start.sh's `hostname -s`).
	hostname func() (string, error)
	// lookPath finds an executable: Envoy's binaryPath is checked at start
	// with it (nil: not checked).
	lookPath func(string) (string, error)
	// lockRoot takes the one-agent-per-root lock in a directory (rootlock.go);
	// nil: no lock (tests that build configs without running them).
	lockRoot func(dir string) (io.Closer, error)
	// resolvConf is the resolver config istio-iptables reads its DNS
	// servers from (the DNS proxy's is the --resolv-conf flag).
	resolvConf string
}

// realHost reads the host the agent runs on.
func realHost() hostInputs {
	return hostInputs{
		env:            config.NewReader(config.Process()),
		euid:           os.Geteuid(),
		interfaceAddrs: interfaceAddrs,
		resolvConf:     resolvConfFile,
		lookPath:       exec.LookPath,
		lockRoot:       lockRoot,
		hostname:       os.Hostname,
		lookupUID: func(name string) (string, error) {
			u, err := user.Lookup(name)
			if err != nil {
				return "", err
			}
			return u.Uid, nil
		},
	}
}

// interfaceAddrs is net.InterfaceAddrs as prefixes, IPv4 unmapped.
func interfaceAddrs() ([]netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		ones, bits := n.Mask.Size()
		ip = ip.Unmap()
		if ip.Is4() && bits == 128 {
			ones -= 96
		}
		out = append(out, netip.PrefixFrom(ip, ones))
	}
	return out, nil
}

// maxConfigFile bounds a configuration file the agent reads on someone
// else's say (the mesh config, cluster.env): services/internal/boundedfile's
// MaxConfig, which cmd cannot import (Go's internal rule), for the same
// reason: a ConfigMap is at most 1 MiB.
const maxConfigFile = 16 << 20

// openConfigFile opens path only if it is a regular file of at most
// maxConfigFile bytes (issue 21): stat first, so that a FIFO cannot hang the
// start and a device (/dev/zero) is never read without end.
func openConfigFile(path string) (io.ReadCloser, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%v)", path, st.Mode().Type())
	}
	if st.Size() > maxConfigFile {
		return nil, fmt.Errorf("%s: %d bytes, over the %d bytes a configuration file may have", path, st.Size(), maxConfigFile)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, maxConfigFile+1), f}, nil
}

// readConfigFile reads a file through openConfigFile.
func readConfigFile(path string) ([]byte, error) {
	f, err := openConfigFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
