package main

import (
	"context"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The stand-in's /stats/prometheus is a valid exposition with what the
// agent's tests rely on: Envoy's and Istio's families, histograms, an
// untyped family, and the lines other tests read.
func TestPrometheusExposition(t *testing.T) {
	e := newEnvoy(&bootstrapv3.Bootstrap{}, knobs{activeConnections: 3})
	e.startInit() // no dynamic resources: live at once
	e.announceLive()
	e.startWorkers(context.Background()) // no readiness knobs: LIVE now
	rec := httptest.NewRecorder()
	e.handlePrometheus(rec, httptest.NewRequest("GET", "/stats/prometheus", nil))
	body := rec.Body.String()

	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("not a valid text exposition: %v\n%s", err, body)
	}
	for name, typ := range map[string]string{
		"envoy_cluster_upstream_cx_total":      "COUNTER",
		"envoy_server_state":                   "GAUGE",
		"envoy_listener_downstream_cx_active":  "GAUGE",
		"envoy_cluster_upstream_cx_connect_ms": "HISTOGRAM",
		"istio_requests_total":                 "COUNTER",
		"istio_request_duration_milliseconds":  "HISTOGRAM",
		"envoy_fake_untyped_samples":           "UNTYPED",
	} {
		f, ok := fams[name]
		if !ok || f.GetType().String() != typ {
			t.Errorf("family %s: %v, want type %s", name, f.GetType(), typ)
		}
	}
	for _, line := range []string{
		"envoy_server_state{} 0",
		`envoy_listener_downstream_cx_active{envoy_listener_address="0.0.0.0_15006"} 3`,
	} {
		if !strings.Contains(body, line+"\n") {
			t.Errorf("exposition lacks %q", line)
		}
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus); the expfmt parse passed")
	}
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = strings.NewReader(body)
	out, err := check.CombinedOutput()
	// promtool exits 3 for lint findings alone (Envoy's families have no
	// HELP, some counters no _total) and 1 for an exposition it cannot
	// parse.
	if code := check.ProcessState.ExitCode(); err != nil && (code != 3 || strings.Contains(string(out), "error while linting")) {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// FAKE_ENVOY_STATS_PEERS=N: Istio's request families for N peers, one
// series a peer (two for the request count: 200 and 503), families sorted
// as Envoy sorts them, ~60 kB a peer.
func TestPrometheusExpositionOfABusySidecar(t *testing.T) {
	scrape := func(peers int) string {
		e := newEnvoy(&bootstrapv3.Bootstrap{}, knobs{activeConnections: 3, statsPeers: peers})
		e.startInit()
		e.announceLive()
		e.startWorkers(context.Background())
		rec := httptest.NewRecorder()
		e.handlePrometheus(rec, httptest.NewRequest("GET", "/stats/prometheus", nil))
		return rec.Body.String()
	}
	one, body := scrape(0), scrape(4)
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("not a valid text exposition: %v", err)
	}
	for name, series := range map[string]int{
		"istio_requests_total": 8, "istio_request_duration_milliseconds": 4,
		"istio_request_bytes": 4, "istio_response_bytes": 4,
	} {
		if got := len(fams[name].GetMetric()); got != series {
			t.Errorf("%s: %d series, want %d", name, got, series)
		}
	}
	var names []string
	for _, line := range strings.Split(body, "\n") {
		if f, ok := strings.CutPrefix(line, "# TYPE istio_"); ok {
			names = append(names, strings.Fields(f)[0])
		}
	}
	if !slices.IsSorted(names) || len(names) != 5 {
		t.Errorf("Istio's families (after istio_): %v, want the five sorted by name", names)
	}
	if grown := len(body) - len(one); grown < 4*50_000 {
		t.Errorf("4 peers grew the exposition by %d bytes, want ~60 kB a peer", grown)
	}
}
