package capture

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/miekg/dns"
)

// HostInputs are the non-flag inputs istio-iptables reads from the host,
// given by the caller (cmd reads the real host; tests inject their own).
type HostInputs struct {
	// ResolvConf is the resolver config DNS servers are read from (Istio's
	// /etc/resolv.conf); needed with RedirectDNS but not CaptureAllDNS.
	ResolvConf string
	// InterfaceAddrs lists the host's addresses in interface order.
	InterfaceAddrs func() ([]netip.Prefix, error)
}

// ErrNoLocalIP: no interface address that is not loopback or link-local.
var ErrNoLocalIP = errors.New("no valid local IP address found")

// FillHostInputs sets HostIP and EnableIPv6 (from the first interface address
// that is not loopback or link-local; with DualStack, IPv6 if any such IPv6
// address exists) and, with RedirectDNS but not CaptureAllDNS, the DNS
// servers from resolv.conf, as istio-iptables does.
func (c *RulesConfig) FillHostInputs(in HostInputs) error {
	if in.InterfaceAddrs == nil {
		return errors.New("list interface addresses: no source of addresses given")
	}
	addrs, err := in.InterfaceAddrs()
	if err != nil {
		return fmt.Errorf("list interface addresses: %w", err)
	}
	ip, ipv6, err := localIP(addrs, c.DualStack)
	if err != nil {
		return err
	}
	c.HostIP, c.EnableIPv6 = ip, ipv6
	return c.FillDNSServers(in)
}

// FillDNSServers sets the DNS servers from resolv.conf when RedirectDNS is
// on and CaptureAllDNS off (the only case they are used).
func (c *RulesConfig) FillDNSServers(in HostInputs) error {
	if !c.RedirectDNS || c.CaptureAllDNS {
		return nil
	}
	path := in.ResolvConf
	if path == "" {
		return errors.New("read DNS servers: no resolv.conf given")
	}
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return fmt.Errorf("read DNS servers from %s: %w", path, err)
	}
	c.DNSServersV4, c.DNSServersV6 = SplitDNSServers(cc.Servers)
	return nil
}

// SplitDNSServers splits resolver addresses by family, re-rendered in netip's
// canonical form (so "::127.0.0.53" becomes "::7f00:35"); unparsable entries
// are skipped.
func SplitDNSServers(servers []string) (v4, v6 []string) {
	for _, s := range servers {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		a = a.Unmap()
		if a.Is4() {
			v4 = append(v4, a.String())
		} else {
			v6 = append(v6, a.String())
		}
	}
	return v4, v6
}

func localIP(addrs []netip.Prefix, dualStack bool) (netip.Addr, bool, error) {
	var first netip.Addr
	ipv6 := false
	for _, p := range addrs {
		a := p.Addr().Unmap()
		if !a.IsValid() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() {
			continue
		}
		if !first.IsValid() {
			first = a
			ipv6 = a.Is6()
			if !dualStack {
				break
			}
			continue
		}
		if a.Is6() {
			ipv6 = true
		}
	}
	if !first.IsValid() {
		return first, false, ErrNoLocalIP
	}
	return first, ipv6, nil
}
