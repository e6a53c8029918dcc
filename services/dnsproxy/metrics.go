package dnsproxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
)

// metrics are Istio's DNS proxy metrics (pkg/dns/client/monitoring.go), by
// the same names, plus the count of locally answered queries.
type metrics struct {
	requests         prometheus.Counter
	localAnswers     prometheus.Counter
	upstreamRequests prometheus.Counter
	upstreamFailures prometheus.Counter
	upstreamDuration prometheus.Histogram

	all []prometheus.Collector // every one above, to register
}

func newMetrics() *metrics {
	var mm messages.Metrics
	m := &metrics{
		requests:         mm.Counter("dns_requests_total", "Total number of DNS requests."),
		localAnswers:     mm.Counter("dns_local_answers_total", "DNS requests answered from the mesh's name table."),
		upstreamRequests: mm.Counter("dns_upstream_requests_total", "Total number of DNS requests forwarded to upstream."),
		upstreamFailures: mm.Counter("dns_upstream_failures_total", "Total number of DNS requests that no upstream answered."),
		upstreamDuration: mm.Histogram("dns_upstream_request_duration_seconds",
			"Total time in seconds it takes to get DNS response from upstream.",
			[]float64{.001, .005, .01, .05, .1, .5, 1, 2, 5}),
	}
	m.all = mm.Collectors()
	return m
}
