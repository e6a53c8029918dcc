package xdsproxy

import (
	"context"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/xdsproxy/protocol"
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
	nacks        *prometheus.CounterVec // type_url
	recvMax      prometheus.Gauge

	all []prometheus.Collector // every one above, to register
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
	var mm messages.Metrics
	m := &metrics{
		istiodFailures:     mm.Counter("istiod_connection_failures", "The total number of connection failures to Istiod"),
		istiodTerminations: mm.CounterVec("istiod_connection_terminations", "The total number of connection errors to Istiod", "type"),
		envoyTerminations:  mm.CounterVec("envoy_connection_terminations", "The total number of connection errors from envoy", "type"),
		requests:           mm.Counter("xds_proxy_requests", "The total number of Xds Proxy Requests"),
		responses:          mm.Counter("xds_proxy_responses", "The total number of Xds Proxy Responses"),
		messages: mm.CounterVec("xds_proxy_messages_total",
			"xDS messages through the proxy, by type URL and direction (request: to the control plane; response: from it; cache: served from the last-known-good configuration).",
			"type_url", "direction"),
		bytes: mm.CounterVec("xds_proxy_bytes_total",
			"Bytes of xDS responses through the proxy, by type URL and direction.",
			"type_url", "direction"),
		servingCache: mm.Gauge("xds_proxy_serving_cache",
			"1 while the proxy serves Envoy its cached configuration because the control plane cannot be reached."),
		stalls: mm.Counter("xds_proxy_stalled_streams_total",
			"Streams ended because the control plane answered nothing while requests waited."),
		cacheWrites: mm.CounterVec("xds_proxy_cache_writes_total",
			"Writes of the last-known-good configuration file, by result.", "result"),
		nacks: mm.CounterVec("xds_proxy_nacks_total",
			"Responses Envoy rejected (NACK), by type URL (issue 22).", "type_url"),
		// Istio's name and help (pkg/xds/monitoring.go), exported by its
		// agent as istio_agent_pilot_xds_recv_max.
		recvMax: mm.Gauge("pilot_xds_recv_max", "The maximum size request we have received so far."),
	}
	m.all = mm.Collectors()
	return m
}

// typeLabel keeps the type_url label's values bounded: a control plane
// could send any type URL, a metric must not grow with them.
func typeLabel(typeURL string) string {
	switch {
	case protocol.Forwardable(typeURL),
		typeURL == nameTableType, typeURL == proxyConfigType, typeURL == healthInfoType:
		if len(typeURL) <= 120 {
			return typeURL
		}
	}
	return "other"
}

// recvMaxHandler is a gRPC stats handler of the XDS socket's server that
// keeps pilot_xds_recv_max, the largest request Envoy has sent, as Istio's
// agent's server does (pilot/pkg/grpc's statsHandler): the figure to watch
// against the bound on a request (maxRequestSize).
type recvMaxHandler struct {
	max   atomic.Int64
	gauge prometheus.Gauge
}

func (h *recvMaxHandler) HandleRPC(_ context.Context, s stats.RPCStats) {
	in, ok := s.(*stats.InPayload)
	if !ok {
		return
	}
	n := int64(in.Length)
	for {
		cur := h.max.Load()
		if n <= cur {
			return
		}
		if h.max.CompareAndSwap(cur, n) {
			h.gauge.Set(float64(n))
			return
		}
	}
}

func (h *recvMaxHandler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (h *recvMaxHandler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (h *recvMaxHandler) HandleConn(context.Context, stats.ConnStats) {}
