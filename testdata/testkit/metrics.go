package testkit

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// MetricValue is the value of the metric name in g: the sum of its series
// whose labels include labels (name, value pairs), 0 when there is none.
// A counter, gauge or untyped series counts its value; a histogram or
// summary its sample count.
func MetricValue(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, _ := metricValue(t, g, name, labels)
	return v
}

// MetricSample is MetricValue for a series that must be there: the test
// fails when g has no series of name whose labels include labels.
func MetricSample(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, n := metricValue(t, g, name, labels)
	if n == 0 {
		t.Fatalf("no sample %s%v", name, labels)
	}
	return v
}

// Families is a parsed exposition (expfmt's TextParser gives one) by
// family name, as a Gatherer for MetricValue and MetricSample.
type Families map[string]*dto.MetricFamily

// Gather returns the families.
func (f Families) Gather() ([]*dto.MetricFamily, error) {
	out := make([]*dto.MetricFamily, 0, len(f))
	for _, mf := range f {
		out = append(out, mf)
	}
	return out, nil
}

// metricValue sums the series of name in g whose labels include labels,
// and counts them.
func metricValue(t testing.TB, g prometheus.Gatherer, name string, labels []string) (sum float64, n int) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			n++
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Untyped != nil:
				sum += m.GetUntyped().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			case m.Summary != nil:
				sum += float64(m.GetSummary().GetSampleCount())
			}
		}
	}
	return sum, n
}

// hasLabels says whether m carries every name, value pair of labels.
func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}
