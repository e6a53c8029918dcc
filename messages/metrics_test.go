package messages

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Every collector a Metrics makes is in Collectors, so that a service
// registering them exports every one.
func TestMetricsKeepsEveryCollectorItMakes(t *testing.T) {
	var mm Metrics
	mm.Counter("a_total", "a").Inc()
	mm.CounterVec("b_total", "b", "kind").WithLabelValues("x").Inc()
	mm.Gauge("c", "c").Set(1)
	mm.GaugeVec("d", "d").WithLabelValues().Set(1)
	mm.Histogram("e_seconds", "e", []float64{1}).Observe(0.5)
	Add(&mm, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "f", Help: "f"}, func() float64 { return 1 }))

	reg := prometheus.NewRegistry()
	rt := NewRuntime("svc", nil, nil, reg, nil)
	if err := rt.Register(mm.Collectors()...); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	want := []string{"a_total", "b_total", "c", "d", "e_seconds", "f"}
	if len(names) != len(want) {
		t.Fatalf("exported %v, want %v", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("exported %v, want %v", names, want)
		}
	}
}
