package controlplane

import (
	"net"
	"strconv"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// routeNameForPort is Istio's name for a sidecar's outbound HTTP route
// configuration: the port number.
func routeNameForPort(p uint32) string { return strconv.Itoa(int(p)) }

// sidecarRoutes builds a route configuration per HTTP port number, with a
// virtual host per service on that port and, last, Istio's allow_any host
// that passes unknown hosts through.
func sidecarRoutes(m Mesh) []types.Resource {
	byPort := map[uint32][]servicePort{}
	var order []uint32
	for _, sp := range servicePorts(m) {
		if !sp.port.Protocol.isHTTP() {
			continue
		}
		if _, seen := byPort[sp.port.Port]; !seen {
			order = append(order, sp.port.Port)
		}
		byPort[sp.port.Port] = append(byPort[sp.port.Port], sp)
	}
	out := make([]types.Resource, 0, len(order))
	for _, p := range order {
		sps := byPort[p]
		// A domain may appear in one virtual host only (Envoy rejects the
		// configuration otherwise). The short name "reviews" is ambiguous
		// when two namespaces have a reviews on this port: Istio resolves it
		// by the proxy's namespace, which one snapshot for every node cannot
		// know, so an ambiguous name is left out and the longer ones remain.
		count := map[string]int{}
		for _, sp := range sps {
			for _, d := range domains(sp) {
				count[d]++
			}
		}
		rc := &route.RouteConfiguration{
			Name: routeNameForPort(p),
			// As Istio: a cluster that is not there yet (CDS and RDS arrive
			// separately) must not make Envoy reject the routes.
			ValidateClusters: wrapperspb.Bool(false),
		}
		for _, sp := range sps {
			var unique []string
			for _, d := range domains(sp) {
				if count[d] == 1 {
					unique = append(unique, d)
				}
			}
			rc.VirtualHosts = append(rc.VirtualHosts, virtualHost(sp, unique))
		}
		rc.VirtualHosts = append(rc.VirtualHosts, &route.VirtualHost{
			Name:    "allow_any",
			Domains: []string{"*"},
			Routes:  []*route.Route{routeTo(passthroughCluster)},
		})
		out = append(out, rc)
	}
	return out
}

// proxylessRoute is the route configuration of one grpc API listener.
func proxylessRoute(sp servicePort) *route.RouteConfiguration {
	return &route.RouteConfiguration{
		Name:         sp.clusterName(),
		VirtualHosts: []*route.VirtualHost{virtualHost(sp, domains(sp))},
	}
}

func virtualHost(sp servicePort, domains []string) *route.VirtualHost {
	return &route.VirtualHost{
		Name:    net.JoinHostPort(sp.fqdn, strconv.Itoa(int(sp.port.Port))),
		Domains: domains,
		Routes:  []*route.Route{routeTo(sp.clusterName())},
	}
}

// routeTo sends every request to the cluster with no route timeout, as
// Istio's default route does (Envoy's own default would cut streams at 15 s).
func routeTo(cluster string) *route.Route {
	return &route.Route{
		Name:  "default",
		Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_Route{Route: &route.RouteAction{
			ClusterSpecifier: &route.RouteAction_Cluster{Cluster: cluster},
			Timeout:          durationpb.New(0),
		}},
	}
}

// domains are the Host headers a service port answers to, as Istio lists
// them: the FQDN, the Kubernetes short forms (name, name.ns, name.ns.svc),
// the VIP, each alone and with :port.
func domains(sp servicePort) []string {
	port := strconv.Itoa(int(sp.port.Port))
	name, ns := sp.svc.Name, sp.svc.Namespace
	vip := sp.vip.String()
	if sp.vip.Is6() {
		vip = "[" + vip + "]"
	}
	var out []string
	for _, h := range []string{sp.fqdn, name, name + "." + ns, name + "." + ns + ".svc", vip} {
		out = append(out, h, h+":"+port)
	}
	return out
}
