package dnsproxy

import (
	"net"
	"strings"

	"github.com/miekg/dns"

	"github.com/meshagent/meshagent/messages"
)

// lookupTable is a NameTable made ready for lookups, keyed by the lower-case
// fully qualified name a query asks for. It is built once per table, off the
// serving path, and never changed after: the handler swaps it in with an
// atomic pointer.
//
// It is compact (#24: 100,000 names held the agent at ~1.8 KB a name, Istio's
// at 2.2 KB): a map entry per real name pointing at its host by index, the
// addresses of every host in one byte slice, and nothing per search
// expansion or per record. The expansions ("<name>.<first search domain>.",
// a CNAME to <name>) are found at lookup by stripping the search domain,
// and the records are made per answer (the UDP server writes the common
// answer straight to the wire: fastanswer.go).
type lookupTable struct {
	version string
	// search is the first search domain, lower case, fully qualified ("" if
	// none): the suffix of a search expansion.
	search string
	// names holds every exact name (hosts and their alt hosts); wildcards
	// the "*.<suffix>." names, keyed by "<suffix>." so that walking a
	// query's labels needs no allocation. Both give an index into hosts.
	names     map[string]uint32
	wildcards map[string]uint32
	hostAddrs []hostAddrs
	// addrs holds every host's addresses: 4 bytes per IPv4 address, then
	// 16 per IPv6 one.
	addrs []byte
	hosts int // hosts of the NameTable that have at least one address
}

// hostAddrs locates one host's addresses in lookupTable.addrs.
type hostAddrs struct {
	off    uint32
	v4, v6 uint16
}

// match is what the table answers for a name.
type match struct {
	host *hostAddrs // nil: not a name of the table
	// owner is the name the address records carry: the query's, or for a
	// search expansion the CNAME's target.
	owner string
	// cname: the query is a search expansion of owner; the answer is
	// CNAME <query> → owner, then owner's records.
	cname bool
}

// buildTable turns a NameTable into a lookupTable, with Istio's alt hosts and
// search-expansion shortcut.
func buildTable(nt messages.NameTable, namespace, domain string, search []string) *lookupTable {
	pd, pdParts := proxyDomain(namespace, domain)
	t := &lookupTable{
		version:   nt.Version,
		names:     make(map[string]uint32, len(nt.Hosts)*4), // Kubernetes: ~3.5 names a host
		wildcards: make(map[string]uint32),
		hostAddrs: make([]hostAddrs, 0, len(nt.Hosts)),
		addrs:     make([]byte, 0, len(nt.Hosts)*net.IPv4len),
	}
	if len(search) > 0 && strings.Trim(search[0], ".") != "" {
		t.search = strings.ToLower(dns.Fqdn(search[0]))
	}
	var names []string // reused: altHosts appends to it
	for host, ni := range nt.Hosts {
		h := hostAddrs{off: uint32(len(t.addrs))}
		for _, ip := range ni.IPs {
			if ip = ip.Unmap(); ip.Is4() && h.v4 < maxAddrs {
				a := ip.As4()
				t.addrs = append(t.addrs, a[:]...)
				h.v4++
			}
		}
		for _, ip := range ni.IPs {
			if ip.Is6() && !ip.Is4In6() && h.v6 < maxAddrs {
				a := ip.As16()
				t.addrs = append(t.addrs, a[:]...)
				h.v6++
			}
		}
		if h.v4+h.v6 == 0 {
			continue // as Istio: a host without a usable address is not known
		}
		t.hosts++
		i := uint32(len(t.hostAddrs))
		t.hostAddrs = append(t.hostAddrs, h)
		names = altHosts(names[:0], host, ni, namespace, pd, pdParts)
		for _, name := range names {
			if suffix, ok := strings.CutPrefix(name, "*."); ok {
				t.wildcards[suffix] = i
			} else {
				t.names[name] = i
			}
		}
	}
	return t
}

// maxAddrs bounds the addresses of one family a host answers with: more
// would not fit in a UDP answer anyway (and the count is a uint16).
const maxAddrs = 1024

// lookup finds what answers a lower-case FQDN: the exact name; else, when
// it ends in the first search domain, the name without it (a search
// expansion, answered with a CNAME: Istio's shortcut for a client's search
// list); else the nearest wildcard "*.<suffix>." walking up the labels, or
// the nearest wildcard's search expansion. A real name always wins over an
// expansion, and an expansion over a wildcard: the order of the table this
// one replaced, where the expansions were names of their own (#24).
func (t *lookupTable) lookup(name string) match {
	if i, ok := t.names[name]; ok {
		return match{host: &t.hostAddrs[i], owner: name}
	}
	base, expands := t.expansion(name)
	if expands {
		if i, ok := t.names[base]; ok {
			return match{host: &t.hostAddrs[i], owner: base, cname: true}
		}
	}
	if len(t.wildcards) == 0 {
		return match{}
	}
	for i := 0; i < len(name)-1; i++ {
		if name[i] != '.' {
			continue
		}
		suffix := name[i+1:]
		if h, ok := t.wildcards[suffix]; ok {
			return match{host: &t.hostAddrs[h], owner: name}
		}
		if s, ok := t.expansion(suffix); ok && expands {
			if h, ok := t.wildcards[s]; ok {
				return match{host: &t.hostAddrs[h], owner: base, cname: true}
			}
		}
	}
	return match{}
}

// expansion is name without the first search domain, if it ends with it
// and has something before it.
func (t *lookupTable) expansion(name string) (string, bool) {
	if t.search == "" || len(name) <= len(t.search) || !strings.HasSuffix(name, t.search) ||
		name[len(name)-len(t.search)-1] != '.' {
		return "", false
	}
	return name[:len(name)-len(t.search)], true
}

// v4 and v6 are the host's addresses of each family, as the records carry
// them (slices of the table's bytes: read-only).
func (t *lookupTable) v4(h *hostAddrs, i int) net.IP {
	o := int(h.off) + i*net.IPv4len
	return net.IP(t.addrs[o : o+net.IPv4len : o+net.IPv4len])
}

func (t *lookupTable) v6(h *hostAddrs, i int) net.IP {
	o := int(h.off) + int(h.v4)*net.IPv4len + i*net.IPv6len
	return net.IP(t.addrs[o : o+net.IPv6len : o+net.IPv6len])
}

// count is how many addresses of qtype's family the host has.
func (h *hostAddrs) count(qtype uint16) int {
	if qtype == dns.TypeAAAA {
		return int(h.v6)
	}
	return int(h.v4)
}

// altHosts appends to out the lower-case FQDNs a host answers to. As Istio's
// agent: a Kubernetes service in the proxy's cluster domain also answers to
// name.ns.svc.cluster.local., name.ns., name.ns.svc., name. (same namespace
// only) and its altHosts; any other host to its own name only.
func altHosts(out []string, host string, ni messages.NameInfo, namespace, pd string, pdParts []string) []string {
	h := strings.ToLower(dns.Fqdn(host))
	out = append(out, h)
	if ni.Registry != registryKubernetes || pd == "" || !strings.HasSuffix(strings.TrimSuffix(h, "."), pd) ||
		ni.Shortname == "" || ni.Namespace == "" {
		return out
	}
	short, ns := strings.ToLower(ni.Shortname), strings.ToLower(ni.Namespace)
	add := func(n string) {
		if !contains(out, n) {
			out = append(out, n)
		}
	}
	add(short + "." + ns + ".")
	if ns == strings.ToLower(namespace) {
		add(short + ".")
	}
	add(short + "." + ns + "." + pdParts[0] + ".")
	for _, a := range ni.AltHosts {
		if a != "" {
			add(strings.ToLower(dns.Fqdn(a)))
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
