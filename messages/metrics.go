package messages

import "github.com/prometheus/client_golang/prometheus"

// Metrics makes a service's collectors and keeps every one it made, so
// that registering them (Runtime.Register(m.Collectors()...)) cannot leave
// one out: the one way services make metrics. The zero value is ready.
type Metrics struct {
	made []prometheus.Collector
}

// Add keeps a collector made otherwise (a GaugeFunc, labels fixed at
// construction) and returns it.
func Add[C prometheus.Collector](m *Metrics, c C) C {
	m.made = append(m.made, c)
	return c
}

// Counter is a counter called name.
func (m *Metrics) Counter(name, help string) prometheus.Counter {
	return Add(m, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

// CounterVec is a counter called name, by labels.
func (m *Metrics) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return Add(m, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

// Gauge is a gauge called name.
func (m *Metrics) Gauge(name, help string) prometheus.Gauge {
	return Add(m, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
}

// GaugeVec is a gauge called name, by labels. With no labels it still
// differs from Gauge: it is not exported until it is first set.
func (m *Metrics) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return Add(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))
}

// Histogram is a histogram called name with the given buckets.
func (m *Metrics) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return Add(m, prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}))
}

// Collectors is every collector made, in the order made.
func (m *Metrics) Collectors() []prometheus.Collector { return m.made }
