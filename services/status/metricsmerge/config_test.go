package metricsmerge

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParsePrometheusAnnotations(t *testing.T) {
	for value, want := range map[string][]ScrapeTarget{
		``:                                 nil,
		`{"scrape":"false","port":"8080"}`: nil,
		`{"scrape":"true"}`:                {{Port: 80, Path: "/metrics"}},
		`{"scrape":"true","port":"9090","path":"/stats"}`: {{Port: 9090, Path: "/stats"}},
		`{"port":9091}`: {{Port: 9091, Path: "/metrics"}},
		`{"targets":[{"port":"9090","path":"/a"},{"port":"9091"}],"port":"1","path":"/x"}`: {{Port: 9090, Path: "/a"}, {Port: 9091, Path: "/metrics"}},
	} {
		got, err := ParsePrometheusAnnotations(value, 15020, 15000)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("ParsePrometheusAnnotations(%s) = %v, %v; want %v", value, got, err, want)
		}
	}
	for _, bad := range []string{
		`{"port":"15020"}`, `{"port":"015020"}`, `{"port":"25020"}`, `{"port":"15000"}`, `{"port":"15001"}`,
		`{"port":"15006"}`, `{"port":"15008"}`, `{"port":"15021"}`, `{"port":"15053"}`, `{"port":"15090"}`,
		`{"port":"http"}`, `{"port":"0"}`, `{"targets":[{"port":"8080"},{"port":"15090"}]}`, `{"scrape":`,
	} {
		_, err := ParsePrometheusAnnotations(bad, 25020, 15000)
		if err == nil || !errors.Is(err, ErrInvalidScrapeConfig) || !strings.Contains(err.Error(), "ISTIO_PROMETHEUS_ANNOTATIONS") {
			t.Errorf("ParsePrometheusAnnotations(%s) = %v; want an error naming ISTIO_PROMETHEUS_ANNOTATIONS", bad, err)
		}
	}
}
