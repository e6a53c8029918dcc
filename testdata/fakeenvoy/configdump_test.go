package main

import (
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/testdata/testkit/envoyadmin"
)

// heldEnvoy is a stand-in holding a static cluster; two clusters and a
// listener over SotW; endpoints over Delta; and a secret with a key.
func heldEnvoy(t *testing.T) *envoy {
	t.Helper()
	e := newEnvoy(&bootstrapv3.Bootstrap{
		Node:            &corev3.Node{Id: "sidecar~10.0.0.1~p.ns~ns.svc.cluster.local"},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{{Name: "xds-grpc"}}},
	}, knobs{})
	for _, u := range []update{
		{typeURL: typeCluster, version: "v1", sotw: true, added: anysOf(&clusterv3.Cluster{Name: "outbound|80||a.ns.svc.cluster.local"},
			&clusterv3.Cluster{Name: "outbound|80||b.ns.svc.cluster.local"})},
		{typeURL: typeEndpoint, added: anysOf(&endpointv3.ClusterLoadAssignment{ClusterName: "outbound|80||a.ns.svc.cluster.local"}),
			addedVersions: []string{"e7"}},
		{typeURL: typeListener, version: "v3", sotw: true, added: anysOf(&listenerv3.Listener{Name: "virtualOutbound"})},
	} {
		if err := e.apply(u); err != nil {
			t.Fatal(err)
		}
	}
	e.record(typeSecret, "default", "s1", &tlsv3.Secret{Name: "default", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: []byte("CHAIN")}},
		PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: []byte("THE-KEY")}},
	}}})
	return e
}

// anysOf is each message in an Any.
func anysOf(ms ...proto.Message) []*anypb.Any {
	var out []*anypb.Any
	for _, m := range ms {
		out = append(out, mustAny(m))
	}
	return out
}

func getDump(t *testing.T, e *envoy, query string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	e.handleConfigDump(rec, httptest.NewRequest("GET", "/config_dump"+query, nil))
	return rec.Code, rec.Body.String()
}

// /config_dump is Envoy's envoy.admin.v3.ConfigDump: typed dumps in
// Envoy's order, each dynamic resource with its version and last update,
// the private key redacted; EDS only with ?include_eds (issue 22).
func TestConfigDumpIsEnvoysFormat(t *testing.T) {
	e := heldEnvoy(t)
	_, body := getDump(t, e, "")
	d, err := envoyadmin.Decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, c := range d.GetConfigs() {
		types = append(types, strings.TrimPrefix(c.GetTypeUrl(), "type.googleapis.com/envoy.admin.v3."))
	}
	if want := []string{"BootstrapConfigDump", "ClustersConfigDump", "ListenersConfigDump", "ScopedRoutesConfigDump",
		"RoutesConfigDump", "SecretsConfigDump"}; !slices.Equal(types, want) {
		t.Fatalf("configs %v; want Envoy's %v", types, want)
	}
	cl := d.Clusters()
	if cl.GetVersionInfo() != "v1" || len(cl.GetStaticClusters()) != 1 || len(cl.GetDynamicActiveClusters()) != 2 {
		t.Fatalf("clusters dump %v", cl)
	}
	for _, c := range cl.GetDynamicActiveClusters() {
		if c.GetVersionInfo() != "v1" || c.GetLastUpdated() == nil {
			t.Errorf("dynamic cluster without version or last_updated: %v", c)
		}
	}
	if l := d.Listeners().GetDynamicListeners(); len(l) != 1 || l[0].GetName() != "virtualOutbound" || l[0].GetActiveState().GetVersionInfo() != "v3" {
		t.Errorf("listeners dump %v", l)
	}
	if d.Bootstrap().GetBootstrap().GetNode().GetId() != "sidecar~10.0.0.1~p.ns~ns.svc.cluster.local" {
		t.Errorf("bootstrap dump %v", d.Bootstrap())
	}
	s := d.Secret("default")
	if string(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes()) != "CHAIN" ||
		s.GetTlsCertificate().GetPrivateKey().GetInlineString() != redacted || strings.Contains(body, "THE-KEY") {
		t.Errorf("secret %v: want the chain and the key redacted", s)
	}

	_, body = getDump(t, e, "?include_eds")
	d, _ = envoyadmin.Decode([]byte(body))
	if eds := d.Endpoints().GetDynamicEndpointConfigs(); len(eds) != 1 || eds[0].GetVersionInfo() != "e7" {
		t.Errorf("?include_eds: endpoints %v; want the one assignment at its Delta version", eds)
	}
}

// The dump's JSON has Envoy's field names, the proto ones, not protobuf
// JSON's camelCase: a script or test written against the stand-in reads
// Envoy's dump (#35). /server_info's node too.
func TestAdminAnswersUseEnvoysFieldNames(t *testing.T) {
	e := heldEnvoy(t)
	e.boot.Admin = &bootstrapv3.Admin{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 15000}}}}}
	e.boot.Node.UserAgentName = "envoy"
	_, body := getDump(t, e, "")
	for _, name := range []string{`"dynamic_active_clusters"`, `"static_clusters"`, `"version_info"`, `"last_updated"`, `"dynamic_listeners"`,
		`"active_state"`, `"socket_address"`, `"port_value"`, `"static_resources"`, `"dynamic_active_secrets"`, `"tls_certificate"`,
		`"certificate_chain"`, `"inline_bytes"`, `"user_agent_name"`} {
		if !strings.Contains(body, name) {
			t.Errorf("/config_dump lacks Envoy's field name %s", name)
		}
	}
	for _, camel := range []string{"dynamicActiveClusters", "versionInfo", "lastUpdated", "socketAddress", "staticResources", "userAgentName"} {
		if strings.Contains(body, camel) {
			t.Errorf("/config_dump has protobuf JSON's %s, not Envoy's name", camel)
		}
	}
	if node := string(mustProtoJSON(e.boot.GetNode())); !strings.Contains(node, `"user_agent_name"`) {
		t.Errorf("/server_info's node %s: want Envoy's user_agent_name", node)
	}
}

// ?resource= gives the entries of one repeated field, each alone; ?mask=
// keeps only the fields named; an unknown resource is a 404, as Envoy's.
func TestConfigDumpResourceAndMask(t *testing.T) {
	e := heldEnvoy(t)
	_, body := getDump(t, e, "?resource=dynamic_active_clusters&mask=cluster.name")
	d, err := envoyadmin.Decode([]byte(body))
	if err != nil || len(d.GetConfigs()) != 2 {
		t.Fatalf("?resource=dynamic_active_clusters: %v, %s", err, body)
	}
	for _, a := range d.GetConfigs() {
		c := &adminv3.ClustersConfigDump_DynamicCluster{}
		if err := a.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		cluster := &clusterv3.Cluster{}
		if err := c.GetCluster().UnmarshalTo(cluster); err != nil {
			t.Fatal(err)
		}
		if c.GetVersionInfo() != "" || c.GetLastUpdated() != nil || !strings.HasPrefix(cluster.GetName(), "outbound|80||") ||
			!proto.Equal(cluster, &clusterv3.Cluster{Name: cluster.GetName()}) {
			t.Errorf("mask cluster.name left %v (cluster %v)", c, cluster)
		}
	}
	if code, _ := getDump(t, e, "?resource=no_such_field"); code != 404 {
		t.Errorf("?resource=no_such_field = %d; want 404", code)
	}
}
