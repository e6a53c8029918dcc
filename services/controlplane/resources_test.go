package controlplane

import (
	"maps"
	"slices"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protopath"
	"google.golang.org/protobuf/reflect/protorange"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

func sampleGenerated(t *testing.T) generated {
	t.Helper()
	m, _, err := ReadMeshFile(sampleMesh)
	if err != nil {
		t.Fatal(err)
	}
	return generate(m)
}

// validateDeep runs Envoy's validation rules (ValidateAll, generated from
// the protos' annotations) on m and on every Any inside it: a listener's
// ValidateAll alone does not look into its filters' typed configs.
func validateDeep(t *testing.T, m proto.Message) {
	t.Helper()
	v, ok := m.(interface{ ValidateAll() error })
	if !ok {
		t.Fatalf("%T has no ValidateAll", m)
	}
	if err := v.ValidateAll(); err != nil {
		t.Errorf("%T %q: %v", m, cache.GetResourceName(m), err)
	}
	err := protorange.Range(m.ProtoReflect(), func(p protopath.Values) error {
		last := p.Index(-1)
		msg, ok := last.Value.Interface().(protoreflect.Message)
		if !ok || msg.Descriptor().FullName() != "google.protobuf.Any" || p.Len() == 1 {
			return nil
		}
		inner, err := anypb.UnmarshalNew(msg.Interface().(*anypb.Any), proto.UnmarshalOptions{})
		if err != nil {
			t.Errorf("%s: %v", p.Path, err)
			return nil
		}
		validateDeep(t, inner)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func names(rs []types.Resource) []string {
	var out []string
	for _, r := range rs {
		out = append(out, cache.GetResourceName(r))
	}
	slices.Sort(out)
	return out
}

func TestGeneratedResourcesPassEnvoyValidation(t *testing.T) {
	g := sampleGenerated(t)
	for _, group := range []map[resource.Type][]types.Resource{g.sidecar, g.proxyless} {
		for _, typ := range slices.Sorted(maps.Keys(group)) {
			for _, r := range group[typ] {
				validateDeep(t, r)
			}
		}
	}
}

func TestSidecarResourcesAreIstiosShape(t *testing.T) {
	g := sampleGenerated(t)
	const (
		reviews    = "outbound|9080||reviews.default.svc.cluster.local"
		ratings    = "outbound|9080||ratings.default.svc.cluster.local"
		ratingsRPC = "outbound|7070||ratings.default.svc.cluster.local"
	)
	if got, want := names(g.sidecar[resource.ClusterType]), []string{
		"BlackHoleCluster", "InboundPassthroughCluster", "PassthroughCluster", ratingsRPC, ratings, reviews,
	}; !slices.Equal(got, want) {
		t.Errorf("clusters = %q, want %q", got, want)
	}
	if got, want := names(g.sidecar[resource.EndpointType]), []string{ratingsRPC, ratings, reviews}; !slices.Equal(got, want) {
		t.Errorf("endpoints = %q, want %q", got, want)
	}
	if got, want := names(g.sidecar[resource.ListenerType]), []string{"0.0.0.0_7070", "0.0.0.0_9080", "virtualInbound", "virtualOutbound"}; !slices.Equal(got, want) {
		t.Errorf("listeners = %q, want %q", got, want)
	}
	if got, want := names(g.sidecar[resource.RouteType]), []string{"7070", "9080"}; !slices.Equal(got, want) {
		t.Errorf("routes = %q, want %q", got, want)
	}

	// go-control-plane's check: every EDS and RDS resource is referenced,
	// and every reference is there.
	snap, err := cache.NewSnapshot("1", g.sidecar)
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Consistent(); err != nil {
		t.Fatal(err)
	}

	byName := func(typ resource.Type, name string) types.Resource {
		t.Helper()
		for _, r := range g.sidecar[typ] {
			if cache.GetResourceName(r) == name {
				return r
			}
		}
		t.Fatalf("%s %q not generated", typ, name)
		return nil
	}
	c := byName(resource.ClusterType, ratingsRPC).(*cluster.Cluster)
	if c.GetType() != cluster.Cluster_EDS || c.GetEdsClusterConfig().GetServiceName() != ratingsRPC ||
		c.GetEdsClusterConfig().GetEdsConfig().GetAds() == nil {
		t.Errorf("grpc cluster is not EDS over ADS: %v", c)
	}
	if _, ok := c.GetTypedExtensionProtocolOptions()[httpProtocolOptionsKey]; !ok {
		t.Errorf("grpc cluster does not speak HTTP/2 upstream: %v", c)
	}
	if _, ok := byName(resource.ClusterType, reviews).(*cluster.Cluster).GetTypedExtensionProtocolOptions()[httpProtocolOptionsKey]; ok {
		t.Errorf("http cluster forced to HTTP/2")
	}

	cla := byName(resource.EndpointType, ratings).(*endpoint.ClusterLoadAssignment)
	var eps []string
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			a := e.GetEndpoint().GetAddress().GetSocketAddress()
			eps = append(eps, a.GetAddress()+":"+itoa(a.GetPortValue()))
		}
	}
	if want := []string{"127.0.0.1:19081", "127.0.0.1:19082"}; !slices.Equal(eps, want) {
		t.Errorf("ratings endpoints = %q, want %q", eps, want)
	}

	vo := byName(resource.ListenerType, "virtualOutbound").(*listener.Listener)
	if vo.GetAddress().GetSocketAddress().GetPortValue() != 15001 || !vo.GetUseOriginalDst().GetValue() {
		t.Errorf("virtualOutbound = %v", vo)
	}
	if vi := byName(resource.ListenerType, "virtualInbound").(*listener.Listener); vi.GetAddress().GetSocketAddress().GetPortValue() != 15006 {
		t.Errorf("virtualInbound = %v", vi)
	}
	l := byName(resource.ListenerType, "0.0.0.0_9080").(*listener.Listener)
	if l.GetBindToPort().GetValue() || l.BindToPort == nil {
		t.Errorf("0.0.0.0_9080 binds its port; it must only receive from virtualOutbound")
	}
	if rds := hcmOf(t, l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig()).GetRds(); rds.GetRouteConfigName() != "9080" {
		t.Errorf("0.0.0.0_9080 routes with %v", rds)
	}

	rc := byName(resource.RouteType, "9080").(*route.RouteConfiguration)
	var vhosts []string
	for _, vh := range rc.GetVirtualHosts() {
		vhosts = append(vhosts, vh.GetName())
	}
	if want := []string{"reviews.default.svc.cluster.local:9080", "ratings.default.svc.cluster.local:9080", "allow_any"}; !slices.Equal(vhosts, want) {
		t.Errorf("virtual hosts = %q, want %q", vhosts, want)
	}
	reviewsHost := rc.GetVirtualHosts()[0]
	for _, d := range []string{"reviews.default.svc.cluster.local", "reviews.default.svc.cluster.local:9080", "reviews", "reviews:9080",
		"reviews.default", "reviews.default.svc", "10.96.0.10", "10.96.0.10:9080"} {
		if !slices.Contains(reviewsHost.GetDomains(), d) {
			t.Errorf("reviews virtual host lacks domain %q: %q", d, reviewsHost.GetDomains())
		}
	}
	if got := reviewsHost.GetRoutes()[0].GetRoute().GetCluster(); got != reviews {
		t.Errorf("reviews routes to %q", got)
	}
}

func TestTCPPortGetsAListenerOnItsVIP(t *testing.T) {
	m := parseMesh(t, `
services:
  - name: db
    namespace: data
    vip: 10.0.0.5
    ports: [{port: 5432, protocol: tcp, endpoints: ["127.0.0.1:15432"]}]
`)
	g := generate(m)
	if got := names(g.sidecar[resource.ListenerType]); !slices.Contains(got, "10.0.0.5_5432") {
		t.Fatalf("listeners = %q, want 10.0.0.5_5432", got)
	}
	if got := names(g.sidecar[resource.RouteType]); len(got) != 0 {
		t.Fatalf("a tcp port got routes %q", got)
	}
	for _, r := range g.sidecar[resource.ListenerType] {
		validateDeep(t, r)
	}
	snap, err := cache.NewSnapshot("1", g.sidecar)
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Consistent(); err != nil {
		t.Fatal(err)
	}
}

// Two namespaces with a "reviews" on one port: Envoy refuses a domain in
// two virtual hosts, so the short name is left out and the rest stays.
func TestAmbiguousShortNamesAreLeftOut(t *testing.T) {
	m := parseMesh(t, `
services:
  - {name: reviews, namespace: a, vip: 10.0.0.1, ports: [{port: 80, protocol: http}]}
  - {name: reviews, namespace: b, vip: 10.0.0.2, ports: [{port: 80, protocol: http}]}
`)
	rc := generate(m).sidecar[resource.RouteType][0].(*route.RouteConfiguration)
	seen := map[string]string{}
	for _, vh := range rc.GetVirtualHosts() {
		for _, d := range vh.GetDomains() {
			if prev, dup := seen[d]; dup {
				t.Errorf("domain %q in %s and %s", d, prev, vh.GetName())
			}
			seen[d] = vh.GetName()
		}
	}
	if _, ok := seen["reviews"]; ok {
		t.Error("ambiguous short name kept")
	}
	if seen["reviews.a"] != "reviews.a.svc.cluster.local:80" || seen["reviews.b:80"] != "reviews.b.svc.cluster.local:80" {
		t.Errorf("namespaced names lost: %v", seen)
	}
}

// What a proxyless gRPC client needs: the API listener it names, the route
// configuration that listener names, and the clusters and endpoints the
// routes name.
func TestProxylessResourcesReferToEachOther(t *testing.T) {
	g := sampleGenerated(t)
	const host = "ratings.default.svc.cluster.local:7070"
	if got := names(g.proxyless[resource.ListenerType]); !slices.Equal(got, []string{host}) {
		t.Fatalf("proxyless listeners = %q, want [%s]", got, host)
	}
	l := g.proxyless[resource.ListenerType][0].(*listener.Listener)
	rdsName := hcmOf(t, l.GetApiListener().GetApiListener()).GetRds().GetRouteConfigName()
	routes := map[string]*route.RouteConfiguration{}
	for _, r := range g.proxyless[resource.RouteType] {
		routes[cache.GetResourceName(r)] = r.(*route.RouteConfiguration)
	}
	rc, ok := routes[rdsName]
	if !ok {
		t.Fatalf("API listener names route %q; routes are %v", rdsName, slices.Collect(maps.Keys(routes)))
	}
	// grpc-go picks the virtual host by the listener name it asked for.
	vh := rc.GetVirtualHosts()[0]
	if !slices.Contains(vh.GetDomains(), host) {
		t.Errorf("domains %q lack %q", vh.GetDomains(), host)
	}
	clusterName := vh.GetRoutes()[0].GetRoute().GetCluster()
	if !slices.Contains(names(g.proxyless[resource.ClusterType]), clusterName) ||
		!slices.Contains(names(g.proxyless[resource.EndpointType]), clusterName) {
		t.Errorf("route names cluster %q, which has no cluster or endpoints", clusterName)
	}
	// Envoy accepts API listeners only in its bootstrap.
	for _, r := range g.sidecar[resource.ListenerType] {
		if r.(*listener.Listener).GetApiListener() != nil {
			t.Errorf("sidecar listener %q is an API listener", cache.GetResourceName(r))
		}
	}
}

func TestNameTableIsIstiosShape(t *testing.T) {
	nt := sampleGenerated(t).nameTable
	if len(nt.GetTable()) != 3 {
		t.Fatalf("table = %v", nt)
	}
	r := nt.GetTable()["reviews.default.svc.cluster.local"]
	if !slices.Equal(r.GetIps(), []string{"10.96.0.10"}) || r.GetRegistry() != "Kubernetes" ||
		r.GetShortname() != "reviews" || r.GetNamespace() != "default" {
		t.Errorf("reviews = %v", r)
	}
	e := nt.GetTable()["api.example.com"]
	if !slices.Equal(e.GetIps(), []string{"240.240.0.10"}) || e.GetShortname() != "" || e.GetNamespace() != "" {
		t.Errorf("api.example.com = %v", e)
	}
}

func hcmOf(t *testing.T, a *anypb.Any) *hcm.HttpConnectionManager {
	t.Helper()
	var m hcm.HttpConnectionManager
	if err := a.UnmarshalTo(&m); err != nil {
		t.Fatal(err)
	}
	return &m
}

func itoa(p uint32) string { return routeNameForPort(p) }
