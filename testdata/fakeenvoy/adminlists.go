package main

// GET /listeners and GET /clusters as Envoy's admin answers them (#35):
// text by default ("name::address"; "cluster::field::value" and
// "cluster::host::field::value" lines), envoy.admin.v3.Listeners and
// envoy.admin.v3.Clusters with ?format=json, in Envoy's proto field names.
// Only active resources: a warming cluster or listener is not listed, as
// in Envoy. The stand-in keeps no traffic counters: every host's are 0.

import (
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/testdata/testkit/envoyadmin"
)

func (e *envoy) handleListeners(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	var listeners []*listenerv3.Listener
	for _, l := range e.boot.GetStaticResources().GetListeners() {
		if !e.removed[l.GetName()] {
			listeners = append(listeners, l)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(e.xds.resources[typeListener])) {
		if l, ok := e.xds.resources[typeListener][name].(*listenerv3.Listener); ok && !(e.xds.live && e.listenerWarmingLocked(name)) {
			listeners = append(listeners, l)
		}
	}
	e.mu.Unlock()
	if r.URL.Query().Get("format") == "json" {
		out := &adminv3.Listeners{}
		for _, l := range listeners {
			out.ListenerStatuses = append(out.ListenerStatuses, &adminv3.ListenerStatus{Name: l.GetName(), LocalAddress: l.GetAddress()})
		}
		writeAdminProto(w, out)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
	for _, l := range listeners {
		fmt.Fprintf(w, "%s::%s\n", l.GetName(), addressText(l.GetAddress()))
	}
}

func (e *envoy) handleClusters(w http.ResponseWriter, r *http.Request) {
	statuses := e.clusterStatuses()
	if r.URL.Query().Get("format") == "json" {
		writeAdminProto(w, &adminv3.Clusters{ClusterStatuses: statuses})
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
	for _, c := range statuses {
		writeClusterText(w, c)
	}
}

// hostStats are the per-host stats Envoy lists, with their types.
var hostStats = []struct {
	name string
	typ  adminv3.SimpleMetric_Type
}{
	{"cx_active", adminv3.SimpleMetric_GAUGE}, {"cx_connect_fail", adminv3.SimpleMetric_COUNTER},
	{"cx_total", adminv3.SimpleMetric_COUNTER}, {"rq_active", adminv3.SimpleMetric_GAUGE},
	{"rq_error", adminv3.SimpleMetric_COUNTER}, {"rq_success", adminv3.SimpleMetric_COUNTER},
	{"rq_timeout", adminv3.SimpleMetric_COUNTER}, {"rq_total", adminv3.SimpleMetric_COUNTER},
}

// clusterStatuses are the active clusters, static first, each with the
// hosts of its load assignment (its own, or the EDS one it names).
func (e *envoy) clusterStatuses() []*adminv3.ClusterStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*adminv3.ClusterStatus
	add := func(c *clusterv3.Cluster, viaAPI bool) {
		st := &adminv3.ClusterStatus{Name: c.GetName(), AddedViaApi: viaAPI, ObservabilityName: c.GetName()}
		if alt := c.GetAltStatName(); alt != "" {
			st.ObservabilityName = alt
		}
		assignment := c.GetLoadAssignment()
		if c.GetType() == clusterv3.Cluster_EDS {
			edsName := c.GetName()
			if n := c.GetEdsClusterConfig().GetServiceName(); n != "" {
				edsName, st.EdsServiceName = n, n
			}
			assignment, _ = e.xds.resources[typeEndpoint][edsName].(*endpointv3.ClusterLoadAssignment)
		}
		for _, locality := range assignment.GetEndpoints() {
			for _, lb := range locality.GetLbEndpoints() {
				weight := lb.GetLoadBalancingWeight().GetValue()
				if weight == 0 {
					weight = 1
				}
				h := &adminv3.HostStatus{Address: lb.GetEndpoint().GetAddress(), Weight: weight,
					Locality: locality.GetLocality(), Priority: locality.GetPriority(),
					HealthStatus: &adminv3.HostHealthStatus{EdsHealthStatus: lb.GetHealthStatus()}}
				for _, s := range hostStats {
					h.Stats = append(h.Stats, &adminv3.SimpleMetric{Name: s.name, Type: s.typ})
				}
				st.HostStatuses = append(st.HostStatuses, h)
			}
		}
		out = append(out, st)
	}
	for _, c := range e.boot.GetStaticResources().GetClusters() {
		add(c, false)
	}
	for _, name := range slices.Sorted(maps.Keys(e.xds.resources[typeCluster])) {
		if c, ok := e.xds.resources[typeCluster][name].(*clusterv3.Cluster); ok && !e.clusterWarmingLocked(name) {
			add(c, true)
		}
	}
	return out
}

// writeClusterText is one cluster in Envoy's text form.
func writeClusterText(w io.Writer, c *adminv3.ClusterStatus) {
	n := c.GetName()
	fmt.Fprintf(w, "%s::observability_name::%s\n", n, c.GetObservabilityName())
	// Envoy's default circuit breakers, as it lists them.
	for _, p := range []string{"default_priority", "high_priority"} {
		for _, l := range []struct {
			name  string
			value int
		}{{"max_connections", 1024}, {"max_pending_requests", 1024}, {"max_requests", 1024}, {"max_retries", 3}} {
			fmt.Fprintf(w, "%s::%s::%s::%d\n", n, p, l.name, l.value)
		}
	}
	fmt.Fprintf(w, "%s::added_via_api::%t\n", n, c.GetAddedViaApi())
	if s := c.GetEdsServiceName(); s != "" {
		fmt.Fprintf(w, "%s::eds_service_name::%s\n", n, s)
	}
	for _, h := range c.GetHostStatuses() {
		prefix := n + "::" + addressText(h.GetAddress())
		for _, s := range h.GetStats() {
			fmt.Fprintf(w, "%s::%s::%d\n", prefix, s.GetName(), s.GetValue())
		}
		fmt.Fprintf(w, "%s::hostname::%s\n", prefix, h.GetHostname())
		fmt.Fprintf(w, "%s::health_flags::%s\n", prefix, healthFlags(h.GetHealthStatus().GetEdsHealthStatus()))
		fmt.Fprintf(w, "%s::weight::%d\n", prefix, h.GetWeight())
		loc := h.GetLocality()
		fmt.Fprintf(w, "%s::region::%s\n%s::zone::%s\n%s::sub_zone::%s\n", prefix, loc.GetRegion(), prefix, loc.GetZone(), prefix, loc.GetSubZone())
		fmt.Fprintf(w, "%s::canary::false\n%s::priority::%d\n", prefix, prefix, h.GetPriority())
		fmt.Fprintf(w, "%s::success_rate::-1\n%s::local_origin_success_rate::-1\n", prefix, prefix)
	}
}

// healthFlags is Envoy's health_flags text for an EDS health status.
func healthFlags(s corev3.HealthStatus) string {
	switch s {
	case corev3.HealthStatus_UNHEALTHY, corev3.HealthStatus_TIMEOUT:
		return "/failed_eds_health"
	case corev3.HealthStatus_DRAINING:
		return "/eds_status_draining"
	case corev3.HealthStatus_DEGRADED:
		return "/degraded_eds_health"
	}
	return "healthy"
}

// addressText is an address as Envoy's admin prints it: ip:port, or the
// pipe's path.
func addressText(a *corev3.Address) string {
	if sa := a.GetSocketAddress(); sa != nil {
		return net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	}
	if p := a.GetPipe(); p != nil {
		return p.GetPath()
	}
	if i := a.GetEnvoyInternalAddress(); i != nil {
		return "envoy://" + i.GetServerListenerName() + "/" + i.GetEndpointId()
	}
	return ""
}

// writeAdminProto answers with m as Envoy's admin writes JSON: proto field
// names.
func writeAdminProto(w http.ResponseWriter, m proto.Message) {
	js, err := envoyadmin.Marshal(m)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(js)
}
