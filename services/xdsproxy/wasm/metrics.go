package wasm

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
)

// metrics are Istio's Wasm metrics (pkg/wasm/monitoring.go), by the same
// names, labels and values; the status server exports them with the
// agent's istio_agent_ prefix, and, as Istio's sums, without _total.
type metrics struct {
	entries     prometheus.Gauge
	lookups     *prometheus.CounterVec // hit: true | false
	fetches     *prometheus.CounterVec // result: fetchResult
	conversions *prometheus.CounterVec // result: conversionResult
	duration    prometheus.Histogram   // milliseconds
	all         []prometheus.Collector
}

// The result label's values, Istio's.
const (
	fetchSuccess     = "success"
	downloadFailure  = "download_failure"
	manifestFailure  = "manifest_failure"
	checksumMismatch = "checksum_mismatched"
	fetchFailure     = "fetch_failure" // also a conversion result

	conversionSuccess   = "success"
	noRemoteLoad        = "no_remote_load"
	marshalFailure      = "marshal_failure"
	unmarshalFailure    = "unmarshal_failure"
	missRemoteFetchHint = "miss_remote_fetch_hint"
)

func newMetrics() *metrics {
	var mm messages.Metrics
	m := &metrics{
		entries: mm.Gauge("wasm_cache_entries", "number of Wasm remote fetch cache entries."),
		lookups: mm.CounterVec("wasm_cache_lookup_count", "number of Wasm remote fetch cache lookups.", "hit"),
		fetches: mm.CounterVec("wasm_remote_fetch_count",
			"number of Wasm remote fetches and results, including success, download failure, and checksum mismatch.", "result"),
		conversions: mm.CounterVec("wasm_config_conversion_count",
			"number of Wasm config conversions and results, including success, no remote load, marshal failure, remote fetch failure, miss remote fetch hint.", "result"),
		duration: mm.Histogram("wasm_config_conversion_duration",
			"Total time in milliseconds istio-agent spends on converting remote load in Wasm config.",
			[]float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}),
	}
	m.all = mm.Collectors()
	return m
}

// Collectors are the cache's metrics, for the service to register.
func (c *Cache) Collectors() []prometheus.Collector { return c.m.all }
