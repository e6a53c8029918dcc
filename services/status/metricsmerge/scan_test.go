package metricsmerge

import (
	"fmt"
	"testing"
)

func TestScanExposition(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		names      string
		clean      bool
	}{
		{"typed and untyped", "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 1\na_total{x=\"2\"} 2\nb 3\n", "[a_total b]", true},
		{"histogram", "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n", "[h]", true},
		{"empty braces", "# TYPE envoy_server_state gauge\nenvoy_server_state{} 0\n", "[envoy_server_state]", true},
		{"split family", "a 1\nb 2\na 3\n", "[a b a]", false},
		{"TYPE after samples", "a 1\n# TYPE a gauge\na 2\n", "[a]", false},
		{"second TYPE", "# TYPE a gauge\na 1\n# TYPE a gauge\na 2\n", "[a]", false},
		{"second HELP", "# HELP a x\n# HELP a y\na 1\n", "[a]", false},
		{"quoted name", "{\"a.b\"} 1\n", "[]", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			names, clean, err := scanExposition([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(names) != tc.names || clean != tc.clean {
				t.Errorf("names %v clean %v, want %s %v", names, clean, tc.names, tc.clean)
			}
		})
	}
	if _, _, err := scanExposition([]byte("a{ 1\n")); err == nil {
		t.Error("a syntax error passed the scan")
	}
}
