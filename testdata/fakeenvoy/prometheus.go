package main

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"
)

// handlePrometheus serves /stats/prometheus as Envoy renders it
// (source/server/admin/prometheus_stats.cc): families sorted by name, one
// TYPE line each, labels from tag extraction, "{}" for a stat without tags,
// histograms with Envoy's default buckets in milliseconds, and the istio_*
// families of Istio's stats filter. Values follow the fake's state where it
// has one (server.state, listeners' active connections, uptime) and are
// fixed otherwise.
func (e *envoy) handlePrometheus(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	stats := e.allStats(false)
	uptime := int(time.Since(e.started).Seconds())

	counter(w, "envoy_cluster_manager_cds_update_success", `{}`, stats["cluster_manager.cds.update_success"])
	counter(w, "envoy_cluster_upstream_cx_total",
		`{cluster_name="xds-grpc"}`, 1,
		`{cluster_name="prometheus_stats"}`, 0,
		`{cluster_name="agent"}`, 2)
	counter(w, "envoy_cluster_upstream_rq_total",
		`{cluster_name="xds-grpc"}`, 1,
		`{cluster_name="agent"}`, 4)
	histogram(w, "envoy_cluster_upstream_cx_connect_ms", `cluster_name="xds-grpc"`, []int{0, 0, 1, 1, 1}, 2.05)
	counter(w, "envoy_listener_manager_lds_update_success", `{}`, stats["listener_manager.lds.update_success"])

	var active []string
	for name, n := range stats {
		l, ok := strings.CutPrefix(name, "listener.")
		if !ok {
			continue
		}
		l, ok = strings.CutSuffix(l, ".downstream_cx_active")
		if !ok || strings.Contains(l, "worker_") {
			continue
		}
		active = append(active, fmt.Sprintf("envoy_listener_downstream_cx_active{envoy_listener_address=%q} %d", l, n))
	}
	sort.Strings(active)
	fmt.Fprintf(w, "# TYPE envoy_listener_downstream_cx_active gauge\n%s\n", strings.Join(active, "\n"))

	gauge(w, "envoy_server_concurrency", `{}`, 2)
	histogram(w, "envoy_server_initialization_time_ms", "", []int{0, 0, 0, 1, 1}, 12)
	gauge(w, "envoy_server_live", `{}`, boolInt(stats["server.state"] == stateLive))
	gauge(w, "envoy_server_memory_allocated", `{}`, 7342128)
	gauge(w, "envoy_server_state", `{}`, stats["server.state"])
	gauge(w, "envoy_server_uptime", `{}`, uptime)
	// Lines without a TYPE line: Prometheus reads them as untyped. Real
	// Envoys type every family; applications often do not, and the
	// agent's merge must take both.
	fmt.Fprintf(w, "envoy_fake_untyped_samples{source=\"fakeenvoy\"} %d\n", 1)

	gauge(w, "istio_build", `{component="proxy",tag="1.31.0"}`, 1)
	e.istioFamilies(w)
}

// istioFamilies writes the families of Istio's stats filter: one series per
// peer and response code, as the filter keeps them (its "reporter=" stats,
// which Istio's stats matcher includes). One peer by default;
// FAKE_ENVOY_STATS_PEERS=N gives N, the exposition of a sidecar with
// traffic, which grows with its peers to megabytes (istio#29110: 8 MB a
// scrape): ~60 kB a peer, as Envoy renders them (#36).
func (e *envoy) istioFamilies(w io.Writer) {
	peers := max(e.k.statsPeers, 1)
	labels := func(i int, code string) string {
		source := "sleep"
		if i > 0 {
			source = fmt.Sprintf("sleep-%d", i)
		}
		return `response_code="` + code + `",reporter="destination",source_workload="` + source +
			`",source_canonical_service="` + source + `",source_canonical_revision="latest",source_workload_namespace="default",` +
			`source_principal="spiffe://cluster.local/ns/default/sa/` + source + `",source_app="` + source + `",source_version="unknown",` +
			`source_cluster="Kubernetes",destination_workload="httpbin",destination_workload_namespace="default",` +
			`destination_principal="spiffe://cluster.local/ns/default/sa/httpbin",destination_app="httpbin",` +
			`destination_version="v1",destination_service="httpbin.default.svc.cluster.local",` +
			`destination_canonical_service="httpbin",destination_canonical_revision="v1",` +
			`destination_service_name="httpbin",destination_service_namespace="default",destination_cluster="Kubernetes",` +
			`request_protocol="http",response_flags="-",grpc_response_status="",connection_security_policy="mutual_tls"`
	}
	// Envoy sorts the families by name. Without the knob, the two
	// families the tests have always read.
	byteFamilies := e.k.statsPeers > 0
	histograms := func(name string) {
		fmt.Fprintf(w, "# TYPE %s histogram\n", name)
		for i := range peers {
			histogramSeries(w, name, labels(i, "200"), []int{0, 3, 7, 9, 9}, 41.5)
		}
	}
	if byteFamilies {
		histograms("istio_request_bytes")
	}
	histograms("istio_request_duration_milliseconds")
	fmt.Fprintf(w, "# TYPE istio_requests_total counter\n")
	for i := range peers {
		fmt.Fprintf(w, "istio_requests_total{%s} 9\n", labels(i, "200"))
		fmt.Fprintf(w, "istio_requests_total{%s} 1\n", labels(i, "503"))
	}
	if byteFamilies {
		histograms("istio_response_bytes")
	}
}

// counter writes a counter family; series are label sets ("{...}") and
// values in turn.
func counter(w io.Writer, name string, series ...any) { family(w, name, "counter", series) }

// gauge writes a gauge family like counter.
func gauge(w io.Writer, name string, series ...any) { family(w, name, "gauge", series) }

func family(w io.Writer, name, typ string, series []any) {
	fmt.Fprintf(w, "# TYPE %s %s\n", name, typ)
	for i := 0; i+1 < len(series); i += 2 {
		fmt.Fprintf(w, "%s%s %v\n", name, series[i], series[i+1])
	}
}

// histogram writes one histogram series: first are the cumulative counts
// of the first buckets, the rest are equal to the last of them.
func histogram(w io.Writer, name, labels string, first []int, sum float64) {
	fmt.Fprintf(w, "# TYPE %s histogram\n", name)
	histogramSeries(w, name, labels, first, sum)
}

// histogramSeries writes one series of a histogram family whose TYPE line
// is written.
func histogramSeries(w io.Writer, name, labels string, first []int, sum float64) {
	sep := ""
	if labels != "" {
		sep = ","
	}
	// Envoy's default histogram bucket bounds (ms).
	envoyBuckets := []string{"0.5", "1", "5", "10", "25", "50", "100", "250", "500", "1000", "2500",
		"5000", "10000", "30000", "60000", "300000", "600000", "1800000", "3600000"}
	count := first[len(first)-1]
	for i, le := range envoyBuckets {
		n := count
		if i < len(first) {
			n = first[i]
		}
		fmt.Fprintf(w, "%s_bucket{%s%sle=\"%s\"} %d\n", name, labels, sep, le, n)
	}
	fmt.Fprintf(w, "%s_bucket{%s%sle=\"+Inf\"} %d\n", name, labels, sep, count)
	fmt.Fprintf(w, "%s_sum{%s} %v\n", name, labels, sum)
	fmt.Fprintf(w, "%s_count{%s} %d\n", name, labels, count)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
