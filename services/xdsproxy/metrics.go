package xdsproxy

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are Istio's XDS proxy metrics (pkg/istio-agent/metrics), by the
// same names and registered bare, as Istio's agent does: the status server
// prefixes the agent's registry with istio_agent_. Istio's are OpenTelemetry
// sums exported without a _total suffix; so are these. Then ours, per type
// URL, and the cache gauge.
type metrics struct {
	istiodFailures     prometheus.Counter
	istiodTerminations *prometheus.CounterVec // type: cancelled | error
	envoyTerminations  *prometheus.CounterVec // type: cancelled | error
	requests           prometheus.Counter
	responses          prometheus.Counter

	messages     *prometheus.CounterVec // type_url, direction
	bytes        *prometheus.CounterVec // type_url, direction
	servingCache prometheus.Gauge
	stalls       prometheus.Counter
	cacheWrites  *prometheus.CounterVec // result: ok | error | too_large
}

// Istio's termination labels.
const (
	terminationCancelled = "cancelled"
	terminationError     = "error"
)

// Directions of xds_proxy_messages_total and xds_proxy_bytes_total.
const (
	dirRequest  = "request"  // Envoy or the agent → control plane
	dirResponse = "response" // control plane → proxy
	dirCache    = "cache"    // served to Envoy from the cache
)

func newMetrics() *metrics {
	return &metrics{
		istiodFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istiod_connection_failures", Help: "The total number of connection failures to Istiod",
		}),
		istiodTerminations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istiod_connection_terminations", Help: "The total number of connection errors to Istiod",
		}, []string{"type"}),
		envoyTerminations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "envoy_connection_terminations", Help: "The total number of connection errors from envoy",
		}, []string{"type"}),
		requests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "xds_proxy_requests", Help: "The total number of Xds Proxy Requests",
		}),
		responses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "xds_proxy_responses", Help: "The total number of Xds Proxy Responses",
		}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "xds_proxy_messages_total",
			Help: "xDS messages through the proxy, by type URL and direction (request: to the control plane; response: from it; cache: served from the last-known-good configuration).",
		}, []string{"type_url", "direction"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "xds_proxy_bytes_total",
			Help: "Bytes of xDS responses through the proxy, by type URL and direction.",
		}, []string{"type_url", "direction"}),
		servingCache: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "xds_proxy_serving_cache",
			Help: "1 while the proxy serves Envoy its cached configuration because the control plane cannot be reached.",
		}),
		stalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "xds_proxy_stalled_streams_total",
			Help: "Streams ended because the control plane answered nothing while requests waited.",
		}),
		cacheWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "xds_proxy_cache_writes_total",
			Help: "Writes of the last-known-good configuration file, by result.",
		}, []string{"result"}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.istiodFailures, m.istiodTerminations, m.envoyTerminations, m.requests, m.responses,
		m.messages, m.bytes, m.servingCache, m.stalls, m.cacheWrites,
	}
}

// typeLabel keeps the type_url label's values bounded: a control plane
// could send any type URL, a metric must not grow with them.
func typeLabel(typeURL string) string {
	switch {
	case strings.HasPrefix(typeURL, envoyTypePrefix),
		typeURL == nameTableType, typeURL == proxyConfigType, typeURL == healthInfoType,
		typeURL == workloadType:
		if len(typeURL) <= 120 {
			return typeURL
		}
	}
	return "other"
}
