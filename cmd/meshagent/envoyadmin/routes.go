package envoyadmin

// The route table of proxy-config (issue 22): one row per route of each
// virtual host, as istioctl shows it.

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
)

// describeRouteMatch is a route's match as istioctl writes it: "/api*" for a
// prefix, the path, "regex ..." (headers are not shown).
func describeRouteMatch(m *routev3.RouteMatch) string {
	var conds []string
	if p := m.GetPrefix(); p != "" {
		conds = append(conds, p+"*")
	}
	if p := m.GetPath(); p != "" {
		conds = append(conds, p)
	}
	if re := m.GetSafeRegex(); re != nil {
		conds = append(conds, "regex "+re.GetRegex())
	}
	return strings.Join(conds, " ")
}

// RouteFilter keeps the route configuration Name, when set.
type RouteFilter struct{ Name string }

// RouteTable is `proxy-config route`: one row per route of each virtual host
// (a virtual host without routes is one "/*" row answering 404), the
// passthrough routes left out as Istio does; route tables sorted by name,
// port numbers first and in numeric order.
func (d *Dump) RouteTable(f RouteFilter) Table {
	rd := d.Routes()
	rcs := append(unpackEach[*routev3.RouteConfiguration](rd.GetDynamicRouteConfigs(), (*adminv3.RoutesConfigDump_DynamicRouteConfig).GetRouteConfig),
		unpackEach[*routev3.RouteConfiguration](rd.GetStaticRouteConfigs(), (*adminv3.RoutesConfigDump_StaticRouteConfig).GetRouteConfig)...)
	rcs = slices.DeleteFunc(rcs, func(rc *routev3.RouteConfiguration) bool { return f.Name != "" && rc.GetName() != f.Name })
	slices.SortStableFunc(rcs, func(a, b *routev3.RouteConfiguration) int {
		na, errA := strconv.Atoi(a.GetName())
		nb, errB := strconv.Atoi(b.GetName())
		switch {
		case errA == nil && errB == nil:
			return cmp.Compare(na, nb)
		case errA == nil:
			return -1
		case errB == nil:
			return 1
		}
		return cmp.Compare(a.GetName(), b.GetName())
	})
	t := Table{Header: []string{"NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE"}}
	for _, rc := range rcs {
		for _, vh := range rc.GetVirtualHosts() {
			domains := describeDomains(vh.GetDomains())
			for _, r := range vh.GetRoutes() {
				if r.GetRoute().GetCluster() == passthroughCluster {
					continue
				}
				t.Rows = append(t.Rows, []string{rc.GetName(), vh.GetName(), domains, describeRouteMatch(r.GetMatch()), istioConfig(r.GetMetadata())})
			}
			if len(vh.GetRoutes()) == 0 {
				t.Rows = append(t.Rows, []string{rc.GetName(), vh.GetName(), domains, "/*", "404"})
			}
		}
		t.Resources = append(t.Resources, rc)
	}
	return t
}

// describeDomains is a virtual host's domains as istioctl shows them: the
// names without a port, a name dropped when its short form is there too
// (reviews.default.svc.cluster.local beside reviews.default), at most two
// and a count of the rest.
func describeDomains(domains []string) string {
	if len(domains) <= 1 {
		return strings.Join(domains, "")
	}
	var bare []string
	for _, d := range domains {
		// host:port is left out; an IPv6 literal ([fd00::1]) is not a port.
		if !strings.Contains(d, ":") || (strings.Count(d, ":") > 2 && strings.HasSuffix(d, "]")) {
			bare = append(bare, d)
		}
	}
	var kept []string
	for _, d := range bare {
		short := []string{strings.TrimSuffix(d, ".svc.cluster.local"), strings.TrimSuffix(d, ".svc")}
		if !slices.ContainsFunc(short, func(s string) bool { return s != d && slices.Contains(bare, s) }) {
			kept = append(kept, d)
		}
	}
	if len(kept) > 2 {
		return fmt.Sprintf("%s + %d more...", strings.Join(kept[:2], ", "), len(kept)-2)
	}
	return strings.Join(kept, ", ")
}
