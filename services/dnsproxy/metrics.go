package dnsproxy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are Istio's DNS proxy metrics (pkg/dns/client/monitoring.go), by
// the same names, plus the count of locally answered queries.
type metrics struct {
	requests         prometheus.Counter
	localAnswers     prometheus.Counter
	upstreamRequests prometheus.Counter
	upstreamFailures prometheus.Counter
	upstreamDuration prometheus.Histogram
}

func newMetrics() *metrics {
	return &metrics{
		requests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dns_requests_total", Help: "Total number of DNS requests.",
		}),
		localAnswers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dns_local_answers_total", Help: "DNS requests answered from the mesh's name table.",
		}),
		upstreamRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dns_upstream_requests_total", Help: "Total number of DNS requests forwarded to upstream.",
		}),
		upstreamFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dns_upstream_failures_total", Help: "Total number of DNS requests that no upstream answered.",
		}),
		upstreamDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dns_upstream_request_duration_seconds",
			Help:    "Total time in seconds it takes to get DNS response from upstream.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 2, 5},
		}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.localAnswers, m.upstreamRequests, m.upstreamFailures, m.upstreamDuration}
}
