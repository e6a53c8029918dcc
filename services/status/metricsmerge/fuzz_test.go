package metricsmerge

import (
	"errors"
	"strings"
	"testing"
)

// The variable the injector fills from the pod's prometheus.io annotations
// is read at start; whatever it holds, the parser must answer with scrape
// targets that hold together, or an error that names the variable, never a
// panic (#21). `make fuzz` runs this for longer (hack/fuzz.sh).

// FuzzParsePrometheusAnnotations: ISTIO_PROMETHEUS_ANNOTATIONS.
func FuzzParsePrometheusAnnotations(f *testing.F) {
	for _, seed := range []string{
		`{"scrape":"true","port":"8080","path":"/metrics"}`,
		`{"scrape":"false"}`,
		`{"targets":[{"port":"9090","path":"/m"},{"port":8081}]}`,
		`{"port":"15020"}`,
		`{"port":"015020"}`,
		`{"port":"70000"}`,
		`{"port":`,
		``,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		targets, err := ParsePrometheusAnnotations(value, 15020, 15000)
		if err != nil {
			if !errors.Is(err, ErrInvalidScrapeConfig) || !strings.HasPrefix(err.Error(), PrometheusAnnotationsEnv+": ") {
				t.Fatalf("error %q: want one naming %s and wrapping ErrInvalidScrapeConfig", err, PrometheusAnnotationsEnv)
			}
			return
		}
		for _, tg := range targets {
			if _, reserved := reservedPortUse(tg.Port); tg.Port < 1 || tg.Port > 65535 || tg.Port == 15020 || tg.Port == 15000 || reserved {
				t.Fatalf("accepted scrape target %+v", tg)
			}
		}
	})
}
