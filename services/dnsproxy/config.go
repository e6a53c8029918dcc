// Package dnsproxy is the agent's DNS proxy: it answers the workload's DNS
// queries for mesh names from the name table the control plane sends (NDS)
// and forwards everything else to the nameservers of resolv.conf, as Istio's
// agent does (pkg/dns/client), on 127.0.0.1:15053 udp and tcp.
package dnsproxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

const (
	// ttl of every local answer (Istio's defaultTTLInSeconds).
	ttl = 30
	// registryKubernetes is the NameInfo.Registry of cluster services, the
	// ones that get short-name alt hosts.
	registryKubernetes = "Kubernetes"
)

// Config is the DNS proxy's configuration; cmd gives every value (Istio's
// defaults are in its table).
type Config struct {
	// Listen is host:port to serve DNS on, udp and tcp (DNS_PROXY_ADDR,
	// Istio's "localhost:15053"). The host must be "localhost" or a loopback
	// IP: the proxy is never an open resolver. "localhost" means 127.0.0.1
	// and/or [::1], by the families of resolv.conf's servers.
	Listen string
	// ResolvConf is the resolv.conf whose nameservers (and port) the proxy
	// forwards to and whose search list it uses (/etc/resolv.conf).
	ResolvConf string
	// Namespace is the proxy's namespace (POD_NAMESPACE): Kubernetes
	// services of this namespace answer to their bare short name.
	Namespace string
	// Domain is the proxy's DNS domain, "<ns>.svc.cluster.local"
	// (ISTIO_META_DNS_DOMAIN / ProxyConfig; default from Namespace and
	// "cluster.local"). Short names are generated only for hosts in it.
	Domain string
	// Search, when not nil, replaces resolv.conf's search list. Only the
	// first domain is used, for Istio's search-expansion shortcut.
	Search []string
	// ForwardTimeout bounds one upstream exchange (DNS_FORWARD_TIMEOUT,
	// Istio's 5s).
	ForwardTimeout time.Duration
	// ForwardParallel sends each forwarded query to all nameservers at once
	// and takes the first answer (DNS_FORWARD_PARALLEL, default false).
	ForwardParallel bool
}

// ErrNotLoopback is returned by Validate for a listen address that is not
// loopback.
var ErrNotLoopback = errors.New("not a loopback address (the DNS proxy must not be an open resolver)")

// withDefaults derives the domain from the namespace when it is not given.
func (c Config) withDefaults() Config {
	if c.Domain == "" && c.Namespace != "" {
		c.Domain = c.Namespace + ".svc.cluster.local"
	}
	return c
}

// Validate checks the configuration; an error names the field and value.
func (c Config) Validate() error {
	c = c.withDefaults()
	// Listen is DNS_PROXY_ADDR as the user set it (or its default): its
	// errors name the variable, not the field (#32).
	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return fmt.Errorf("DNS_PROXY_ADDR=%q: want host:port: %w", c.Listen, err)
	}
	if _, err := net.LookupPort("udp", port); err != nil {
		return fmt.Errorf("DNS_PROXY_ADDR=%q: bad port: %w", c.Listen, err)
	}
	if host != "localhost" {
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.IsLoopback() {
			return fmt.Errorf("DNS_PROXY_ADDR=%q: %w; use a loopback address such as localhost:15053", c.Listen, ErrNotLoopback)
		}
	}
	if c.ResolvConf == "" {
		return errors.New("the resolv.conf to forward to (--resolv-conf) is empty")
	}
	if c.ForwardTimeout <= 0 {
		return fmt.Errorf("DNS_FORWARD_TIMEOUT=%s: must be positive", c.ForwardTimeout)
	}
	for _, d := range c.Search {
		if _, ok := dns.IsDomainName(d); !ok || d == "" {
			return fmt.Errorf("search domain %q: not a domain name", d)
		}
	}
	if c.Domain != "" {
		if _, ok := dns.IsDomainName(c.Domain); !ok {
			return fmt.Errorf("--domain %q (else POD_NAMESPACE.svc.cluster.local): not a domain name", c.Domain)
		}
	}
	return nil
}

// resolvConf is what the proxy takes from resolv.conf.
type resolvConf struct {
	servers []string // host:port
	search  []string
}

// loadResolvConf reads path as Istio does (miekg's parser): nameservers with
// the file's port, and the search list.
func loadResolvConf(path string) (resolvConf, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return resolvConf{}, fmt.Errorf("resolv.conf %s: %w", path, err)
	}
	var rc resolvConf
	for _, s := range cc.Servers {
		if _, err := netip.ParseAddr(s); err != nil {
			return resolvConf{}, fmt.Errorf("resolv.conf %s: nameserver %q: %w", path, s, err)
		}
		rc.servers = append(rc.servers, net.JoinHostPort(s, cc.Port))
	}
	if len(rc.servers) == 0 {
		return resolvConf{}, fmt.Errorf("resolv.conf %s: no nameserver", path)
	}
	rc.search = cc.Search
	return rc, nil
}

// listenAddrs expands the listen address: "localhost" becomes 127.0.0.1 if
// any upstream is IPv4 and [::1] if any is IPv6 (Istio binds each family
// explicitly, because Go would pick only one for "localhost").
func listenAddrs(listen string, servers []string) []string {
	host, port, _ := net.SplitHostPort(listen)
	if host != "localhost" {
		return []string{listen}
	}
	var v4, v6 bool
	for _, s := range servers {
		h, _, _ := net.SplitHostPort(s)
		if ip, err := netip.ParseAddr(h); err == nil {
			if ip.Unmap().Is4() {
				v4 = true
			} else {
				v6 = true
			}
		}
	}
	var out []string
	if v4 || !v6 {
		out = append(out, net.JoinHostPort("127.0.0.1", port))
	}
	if v6 {
		out = append(out, net.JoinHostPort("::1", port))
	}
	return out
}

// proxyDomain is the proxy's domain without its namespace label
// ("svc.cluster.local"), split once, as the alt-host generator needs it.
func proxyDomain(namespace, domain string) (string, []string) {
	domain = strings.TrimSuffix(domain, ".")
	if domain == "" {
		return "", nil
	}
	parts := strings.Split(domain, ".")
	if parts[0] == namespace {
		parts = parts[1:]
	}
	if len(parts) == 0 {
		return "", nil
	}
	return strings.Join(parts, "."), parts
}
