package main

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/services/sds"
)

// realHost reads the host the agent runs on.
func realHost() config.Host {
	return config.Host{
		Env:            config.NewReader(config.Process()),
		EUID:           os.Geteuid(),
		InterfaceAddrs: interfaceAddrs,
		ResolvConf:     config.ResolvConfFile,
		LookPath:       exec.LookPath,
		LockRoot:       lockRoot,
		Hostname:       os.Hostname,
		FileExists:     fileExists,
		SocketLive:     sds.SocketLive,
		LookupUID: func(name string) (string, error) {
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

// fileExists is the host's probe of a file the configuration's choices
// follow (config.Host.FileExists).
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
