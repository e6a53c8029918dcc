package dnsproxy

import (
	"net"
	"net/netip"
	"strings"

	"github.com/miekg/dns"

	"github.com/meshagent/meshagent/messages"
)

// lookupTable is a NameTable turned into prebuilt answers, keyed by the
// lower-case fully qualified name a query asks for. It is built once per
// table and never changed after: queries share its records read-only (miekg
// packs records without writing to them), so an answer is a map lookup and
// at most one slice allocation.
type lookupTable struct {
	version string
	// source and how it was expanded, for /debug/ndsz.
	source            messages.NameTable
	namespace, domain string
	// names holds every exact name: hosts, their alt hosts, and their
	// search expansions (as CNAMEs).
	names map[string]*entry
	// wildcards holds the entries of "*.<suffix>." names, keyed by
	// "<suffix>." so that walking a query's labels needs no allocation.
	wildcards map[string]*entry
	hosts     int // hosts of the NameTable that have at least one address
}

// entry is what the proxy answers for one name.
type entry struct {
	// cname, if set, makes this name a search expansion of a host:
	// "<host>.<first search domain>." answers CNAME <host>, then the
	// host's records. Its Hdr.Name is this entry's name.
	cname *dns.CNAME
	// a and aaaa are the host's records (named after the host: this name,
	// or the CNAME's target).
	a, aaaa []dns.RR
	// searchSuffix is, for a wildcard's search expansion, the
	// ".<search domain>." the query carries after the wildcard's name, so
	// that the CNAME target is the query minus it.
	searchSuffix string
}

// buildTable turns a NameTable into a lookupTable, with Istio's alt hosts and
// search-expansion shortcut.
func buildTable(nt messages.NameTable, namespace, domain string, search []string) *lookupTable {
	pd, pdParts := proxyDomain(namespace, domain)
	t := &lookupTable{
		version:   nt.Version,
		source:    nt,
		namespace: namespace,
		domain:    domain,
		names:     make(map[string]*entry, len(nt.Hosts)*6), // Kubernetes: ~3 names and their expansions
		wildcards: make(map[string]*entry),
	}
	var firstSearch string
	if len(search) > 0 && strings.Trim(search[0], ".") != "" {
		firstSearch = strings.ToLower(dns.Fqdn(search[0]))
	}
	type expansion struct {
		name, target string
		e            *entry // preallocated, filled if the name is free
	}
	expansions := make([]expansion, 0, len(nt.Hosts)*3)
	for host, ni := range nt.Hosts {
		var v4, v6 []netip.Addr
		for _, ip := range ni.IPs {
			if ip = ip.Unmap(); ip.Is4() {
				v4 = append(v4, ip)
			} else if ip.Is6() {
				v6 = append(v6, ip)
			}
		}
		if len(v4)+len(v6) == 0 {
			continue // as Istio: a host without a usable address is not known
		}
		t.hosts++
		names := altHosts(host, ni, namespace, pd, pdParts)
		// One allocation per kind per host, not per name: building 10,000
		// hosts is then a few tens of milliseconds.
		entries := make([]entry, 2*len(names))
		cnames := make([]dns.CNAME, len(names))
		a := newRecordSlab(v4, len(names), dns.TypeA)
		aaaa := newRecordSlab(v6, len(names), dns.TypeAAAA)
		for i, name := range names {
			e := &entries[i]
			e.a, e.aaaa = a.records(i, name), aaaa.records(i, name)
			t.put(name, e)
			if firstSearch == "" {
				continue
			}
			exp := name + firstSearch
			if contains(names, exp) {
				continue // already a real name of this host
			}
			x := &entries[len(names)+i]
			x.cname = &cnames[i]
			*x.cname = dns.CNAME{Hdr: dns.RR_Header{Name: exp, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: ttl}, Target: name}
			x.a, x.aaaa = e.a, e.aaaa
			if strings.HasPrefix(exp, "*.") {
				x.searchSuffix = "." + firstSearch
			}
			expansions = append(expansions, expansion{exp, name, x})
		}
	}
	// Expansions go in after every real name, so that a real name always
	// wins over another host's expansion (Istio's order is map order).
	for _, x := range expansions {
		if _, ok := t.lookupExact(x.name); !ok {
			t.put(x.name, x.e)
		}
	}
	return t
}

func (t *lookupTable) put(name string, e *entry) {
	if suffix, ok := strings.CutPrefix(name, "*."); ok {
		t.wildcards[suffix] = e
		return
	}
	t.names[name] = e
}

func (t *lookupTable) lookupExact(name string) (*entry, bool) {
	if suffix, ok := strings.CutPrefix(name, "*."); ok {
		e, ok := t.wildcards[suffix]
		return e, ok
	}
	e, ok := t.names[name]
	return e, ok
}

// lookup finds the entry for a lower-case FQDN: the exact name, else the
// nearest wildcard "*.<suffix>." walking up the labels. wildcard says the
// records must be renamed to the query's name.
func (t *lookupTable) lookup(name string) (e *entry, wildcard bool) {
	if e, ok := t.names[name]; ok {
		return e, false
	}
	if len(t.wildcards) == 0 {
		return nil, false
	}
	for i := 0; i < len(name)-1; i++ {
		if name[i] != '.' {
			continue
		}
		if e, ok := t.wildcards[name[i+1:]]; ok {
			return e, true
		}
	}
	return nil, false
}

// altHosts lists the lower-case FQDNs a host answers to. As Istio's agent: a
// Kubernetes service in the proxy's cluster domain also answers to
// name.ns.svc.cluster.local., name.ns., name.ns.svc., name. (same namespace
// only) and its altHosts; any other host to its own name only.
func altHosts(host string, ni messages.NameInfo, namespace, pd string, pdParts []string) []string {
	h := strings.ToLower(dns.Fqdn(host))
	out := make([]string, 1, 4+len(ni.AltHosts))
	out[0] = h
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

// recordSlab holds the A (or AAAA) records of one host for all its names
// in two allocations; the address bytes are shared by every name.
type recordSlab struct {
	rrs []dns.RR
	per int
}

func newRecordSlab(ips []netip.Addr, names int, rrtype uint16) recordSlab {
	if len(ips) == 0 {
		return recordSlab{}
	}
	if rrtype == dns.TypeA {
		return fillSlab(ips, names, rrtype, func(r *dns.A, h dns.RR_Header, ip net.IP) { r.Hdr, r.A = h, ip })
	}
	return fillSlab(ips, names, rrtype, func(r *dns.AAAA, h dns.RR_Header, ip net.IP) { r.Hdr, r.AAAA = h, ip })
}

// fillSlab makes the records of R (A or AAAA) for names names, each with
// every address of ips: one allocation for the records and one for the
// addresses' bytes, which every name's records share. set fills a record
// with its header and address.
func fillSlab[R any, P interface {
	*R
	dns.RR
}](ips []netip.Addr, names int, rrtype uint16, set func(P, dns.RR_Header, net.IP)) recordSlab {
	size := net.IPv4len
	if rrtype == dns.TypeAAAA {
		size = net.IPv6len
	}
	raw := make([]byte, 0, size*len(ips))
	for _, ip := range ips {
		// An IPv4 address is the last four bytes of its 16-byte form.
		b := ip.As16()
		raw = append(raw, b[net.IPv6len-size:]...)
	}
	n := len(ips) * names
	s := recordSlab{rrs: make([]dns.RR, n), per: len(ips)}
	recs := make([]R, n)
	hdr := dns.RR_Header{Rrtype: rrtype, Class: dns.ClassINET, Ttl: ttl}
	for i := range recs {
		k := i % len(ips)
		r := P(&recs[i])
		set(r, hdr, raw[size*k:size*(k+1):size*(k+1)])
		s.rrs[i] = r
	}
	return s
}

// records returns the records of the i-th name, named name.
func (s recordSlab) records(i int, name string) []dns.RR {
	if s.per == 0 {
		return nil
	}
	out := s.rrs[i*s.per : (i+1)*s.per : (i+1)*s.per]
	for _, r := range out {
		r.Header().Name = name
	}
	return out
}
