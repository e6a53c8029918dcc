package metricsmerge

import (
	"os"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// Every OpenMetrics type becomes a family the text format can carry.
func TestParseOpenMetricsTypes(t *testing.T) {
	// One family of each type (testdata/every-type.openmetrics): jobs
	// (counter, with _created), rpc (summary), build (info), mode
	// (stateset), queue_size (gaugehistogram), temp_celsius (gauge, UNIT).
	body, err := os.ReadFile("testdata/every-type.openmetrics")
	if err != nil {
		t.Fatal(err)
	}
	fams, err := parseExposition(body, "application/openmetrics-text; version=1.0.0; charset=utf-8")
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	want := map[string]dto.MetricType{
		"jobs_total": dto.MetricType_COUNTER, "rpc": dto.MetricType_SUMMARY, "build_info": dto.MetricType_GAUGE,
		"mode": dto.MetricType_GAUGE, "queue_size": dto.MetricType_GAUGE_HISTOGRAM, "temp_celsius": dto.MetricType_GAUGE,
	}
	if len(fams) != len(want) {
		t.Errorf("got %d families, want %d (no _created family)", len(fams), len(want))
	}
	for name, typ := range want {
		if f := byName[name]; f == nil || f.GetType() != typ {
			t.Errorf("%s: %v, want %v", name, f.GetType(), typ)
		}
	}
	jobs := byName["jobs_total"]
	if m := jobs.GetMetric()[0]; m.GetCounter().GetValue() != 3 || m.GetTimestampMs() != 1700000000500 || jobs.GetHelp() != "Jobs done." {
		t.Errorf("jobs_total = %v (help %q)", m, jobs.GetHelp())
	}
	if s := byName["rpc"].GetMetric()[0].GetSummary(); len(s.GetQuantile()) != 2 || s.GetSampleCount() != 20 || s.GetSampleSum() != 5 {
		t.Errorf("rpc = %v", s)
	}
	if h := byName["queue_size"].GetMetric()[0].GetHistogram(); len(h.GetBucket()) != 2 || h.GetSampleCount() != 6 || h.GetSampleSum() != 50 {
		t.Errorf("queue_size = %v", h)
	}
	if n := len(byName["mode"].GetMetric()); n != 2 {
		t.Errorf("mode has %d series, want 2", n)
	}
}

// A body that is not an exposition is an error, not an empty result.
func TestParseExpositionRejectsGarbage(t *testing.T) {
	for _, ct := range []string{"text/plain; version=0.0.4", "application/openmetrics-text; version=1.0.0"} {
		if _, err := parseExposition([]byte("this is { not metrics\n"), ct); err == nil {
			t.Errorf("%s: garbage accepted", ct)
		}
	}
}
