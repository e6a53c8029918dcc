package config

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"syscall"
)

// Host is everything the configuration reads from the host besides
// flags and files under --root: production fills it from the real host
// (cmd's realHost), tests by hand. The builders read the host only
// through it.
type Host struct {
	// Env is the process environment, read by Env's names, each read
	// counted (#26).
	Env *Reader
	// EUID is the agent's effective uid (Envoy runs as 1337 only when the
	// agent is root and DNS is served on :53, as in Istio).
	EUID int
	// InterfaceAddrs lists the host's addresses in interface order: the
	// node's IPs after INSTANCE_IP, and istio-iptables' IPv6 decision.
	InterfaceAddrs func() ([]netip.Prefix, error)
	// LookupUID resolves a user name ($ENVOY_USER, istio-iptables' default
	// --proxy-uid).
	LookupUID func(name string) (string, error)
	// Hostname is the host's name (a VM's POD_NAME by default, as
	// istio-start.sh's `hostname -s`).
	Hostname func() (string, error)
	// LookPath finds an executable: Envoy's binaryPath is checked at start
	// with it (nil: not checked).
	LookPath func(string) (string, error)
	// LockRoot takes the one-agent-per-root lock in a directory (cmd's rootlock.go);
	// nil: no lock (tests that build configs without running them).
	LockRoot func(dir string) (io.Closer, error)
	// FileExists and SocketLive probe a path: Istio's choices follow what
	// is mounted (a ./etc/certs root for the control plane's roots; an
	// external SDS server answering on its socket, a credential socket).
	// The builders probe nothing themselves (#26). Nil: nothing exists,
	// nothing answers.
	FileExists func(path string) bool
	SocketLive func(path string) bool
	// ResolvConf is the resolver config istio-iptables reads its DNS
	// servers from (the DNS proxy's is the --resolv-conf flag).
	ResolvConf string
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

func (h Host) fileExists(path string) bool { return h.FileExists != nil && h.FileExists(path) }
func (h Host) socketLive(path string) bool { return h.SocketLive != nil && h.SocketLive(path) }
