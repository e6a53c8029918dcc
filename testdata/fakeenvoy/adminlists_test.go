package main

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"google.golang.org/protobuf/encoding/protojson"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
)

func socketAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
}

// GET /listeners and /clusters as Envoy's admin answers them (#35): text
// lines "name::address" and "cluster::host::field::value", and with
// ?format=json Envoy's Listeners and Clusters in proto field names.
func TestListenersAndClusters(t *testing.T) {
	e := newEnvoy(&bootstrapv3.Bootstrap{StaticResources: &bootstrapv3.Bootstrap_StaticResources{
		Listeners: []*listenerv3.Listener{{Name: "0.0.0.0_15021", Address: socketAddress("0.0.0.0", 15021)}},
		Clusters:  []*clusterv3.Cluster{{Name: "xds-grpc"}},
	}}, knobs{})
	eds := &clusterv3.Cluster{Name: "outbound|9080||reviews.default.svc.cluster.local",
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{ServiceName: "outbound|9080||reviews.default.svc.cluster.local"}}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: eds.Name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
		Locality: &corev3.Locality{Region: "r1", Zone: "z1"},
		LbEndpoints: []*endpointv3.LbEndpoint{
			{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: socketAddress("10.0.0.7", 9080)}}},
			{HealthStatus: corev3.HealthStatus_UNHEALTHY, HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: socketAddress("10.0.0.8", 9080)}}},
		}}}}
	for _, u := range []update{
		{typeURL: typeCluster, version: "1", sotw: true, added: anysOf(eds)},
		{typeURL: typeEndpoint, version: "1", sotw: true, added: anysOf(cla)},
		{typeURL: typeListener, version: "1", sotw: true, added: anysOf(&listenerv3.Listener{Name: "virtualOutbound", Address: socketAddress("0.0.0.0", 15001)})},
	} {
		if err := e.apply(u); err != nil {
			t.Fatal(err)
		}
	}
	get := func(path string) string {
		rec := httptest.NewRecorder()
		e.adminMux(make(chan int, 1)).ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != 200 {
			t.Fatalf("GET %s = %d %s", path, rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	if got := get("/listeners"); got != "0.0.0.0_15021::0.0.0.0:15021\nvirtualOutbound::0.0.0.0:15001\n" {
		t.Errorf("/listeners:\n%s", got)
	}
	js := get("/listeners?format=json")
	var ls adminv3.Listeners
	if err := protojson.Unmarshal([]byte(js), &ls); err != nil || len(ls.GetListenerStatuses()) != 2 || !strings.Contains(js, `"listener_statuses"`) ||
		!strings.Contains(js, `"local_address"`) {
		t.Errorf("/listeners?format=json: %v\n%s", err, js)
	}
	text := get("/clusters")
	for _, line := range []string{
		"xds-grpc::added_via_api::false\n",
		"outbound|9080||reviews.default.svc.cluster.local::added_via_api::true\n",
		"outbound|9080||reviews.default.svc.cluster.local::default_priority::max_connections::1024\n",
		"outbound|9080||reviews.default.svc.cluster.local::10.0.0.7:9080::health_flags::healthy\n",
		"outbound|9080||reviews.default.svc.cluster.local::10.0.0.8:9080::health_flags::/failed_eds_health\n",
		"outbound|9080||reviews.default.svc.cluster.local::10.0.0.7:9080::region::r1\n",
		"outbound|9080||reviews.default.svc.cluster.local::10.0.0.7:9080::cx_active::0\n",
	} {
		if !strings.Contains(text, line) {
			t.Errorf("/clusters lacks %q:\n%s", line, text)
		}
	}
	js = get("/clusters?format=json")
	var cs adminv3.Clusters
	if err := protojson.Unmarshal([]byte(js), &cs); err != nil || len(cs.GetClusterStatuses()) != 2 ||
		len(cs.GetClusterStatuses()[1].GetHostStatuses()) != 2 || !strings.Contains(js, `"cluster_statuses"`) || !strings.Contains(js, `"host_statuses"`) ||
		!strings.Contains(js, `"eds_health_status": "UNHEALTHY"`) {
		t.Errorf("/clusters?format=json: %v\n%s", err, js)
	}
}

// /stats?format=json is Envoy's {"stats": [{"name", "value"}]}, filtered as
// the text form (#35).
func TestStatsJSON(t *testing.T) {
	e := newEnvoy(&bootstrapv3.Bootstrap{}, knobs{})
	rec := httptest.NewRecorder()
	e.adminMux(make(chan int, 1)).ServeHTTP(rec, httptest.NewRequest("GET", "/stats?format=json&filter=^server\\.state$", nil))
	var got struct {
		Stats []struct {
			Name  string `json:"name"`
			Value *int   `json:"value"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || len(got.Stats) != 1 || got.Stats[0].Name != "server.state" || got.Stats[0].Value == nil {
		t.Errorf("/stats?format=json&filter=^server\\.state$: %v\n%s", err, rec.Body)
	}
}
