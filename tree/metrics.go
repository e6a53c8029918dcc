package tree

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
)

// metrics are the tree's Prometheus counters.
type metrics struct {
	restarts *prometheus.CounterVec
	panics   *prometheus.CounterVec
	giveUps  *prometheus.CounterVec
	// stopTimeouts counts services that overran their stop timeout.
	stopTimeouts *prometheus.CounterVec
	dropped      prometheus.CounterFunc
}

// newMetrics registers the tree's counters. healthDropped reports how many
// Health events the stream has dropped so far (it counts them itself).
func newMetrics(reg prometheus.Registerer, healthDropped func() uint64) (*metrics, error) {
	var mm messages.Metrics
	m := &metrics{
		restarts: mm.CounterVec("meshagent_service_restarts_total",
			"Restarts of a service by its supervisor after it failed, panicked or asked to be restarted.", "service"),
		panics: mm.CounterVec("meshagent_service_panics_total", "Panics recovered from a service.", "service"),
		giveUps: mm.CounterVec("meshagent_service_give_ups_total",
			"Services that failed more often than their restart limit allows.", "service"),
		stopTimeouts: mm.CounterVec("meshagent_service_stop_timeouts_total",
			"Times a service did not return within its stop timeout once cancelled (it ignores cancellation).", "service"),
		dropped: messages.Add(&mm, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "meshagent_health_events_dropped_total",
			Help: "Health events dropped because the status server fell behind.",
		}, func() float64 { return float64(healthDropped()) })),
	}
	for _, c := range mm.Collectors() {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
