package metricsmerge

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/meshagent/meshagent/messages"
)

// An OpenMetrics caller gets one OpenMetrics exposition that parses, each
// family once with its type: the agent's under Istio's prefix, Envoy's
// text and the application's OpenMetrics (the status server's tests scrape
// the same through its routes).
func TestOpenMetricsAnswer(t *testing.T) {
	source := func(contentType, body string) int {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", contentType)
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(srv.Close)
		port, _ := strconv.Atoi(srv.URL[strings.LastIndex(srv.URL, ":")+1:])
		return port
	}
	envoy := source("text/plain; version=0.0.4", `# TYPE envoy_cx_connect_ms histogram
envoy_cx_connect_ms_bucket{le="1"} 1
envoy_cx_connect_ms_bucket{le="+Inf"} 2
envoy_cx_connect_ms_sum 3
envoy_cx_connect_ms_count 2
`)
	app := source(string(expfmt.FmtOpenMetrics_1_0_0), `# TYPE shop_orders counter
shop_orders_total{kind="book"} 7
shop_orders_created{kind="book"} 1700000000
# EOF
`)
	reg := prometheus.NewRegistry()
	restarts := prometheus.NewCounter(prometheus.CounterOpts{Name: "restarts_total", Help: "Restarts."})
	restarts.Add(3)
	reg.MustRegister(restarts)
	var mm messages.Metrics
	h := New(Config{EnvoyPort: envoy, App: []ScrapeTarget{{Port: app, Path: "/metrics"}}}, reg, slog.New(slog.DiscardHandler), &mm)
	defer h.CloseIdleConnections()

	req := httptest.NewRequest(http.MethodGet, "/stats/prometheus", nil)
	req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	ct := rec.Header().Get("Content-Type")
	if rec.Code != http.StatusOK || expfmt.Format(ct).FormatType() != expfmt.TypeOpenMetrics {
		t.Fatalf("answer %d %q, want 200 OpenMetrics", rec.Code, ct)
	}
	fams, err := parseExposition(rec.Body.Bytes(), ct)
	if err != nil {
		t.Fatalf("merged OpenMetrics does not parse: %v\n%s", err, rec.Body)
	}
	names := map[string]dto.MetricType{}
	for _, f := range fams {
		if _, dup := names[f.GetName()]; dup {
			t.Errorf("family %s twice in the OpenMetrics answer", f.GetName())
		}
		names[f.GetName()] = f.GetType()
	}
	for name, typ := range map[string]dto.MetricType{
		"istio_agent_restarts_total": dto.MetricType_COUNTER,
		"envoy_cx_connect_ms":        dto.MetricType_HISTOGRAM,
		"shop_orders_total":          dto.MetricType_COUNTER,
	} {
		if got, ok := names[name]; !ok || got != typ {
			t.Errorf("%s: %v (present %v), want %v\n%s", name, got, ok, typ, rec.Body)
		}
	}
}

// Text sources are answered in text even when the caller prefers
// OpenMetrics, as Istio's agent answers, as long as it accepts text:
// Prometheus does, and OpenMetrics would add nothing to text sources but
// the cost of parsing Envoy's every line (#36). A caller that accepts only
// OpenMetrics still gets it.
func TestTextSourcesAnsweredInText(t *testing.T) {
	envoyBody := "# TYPE envoy_server_live gauge\nenvoy_server_live 1\n"
	envoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, envoyBody)
	}))
	t.Cleanup(envoy.Close)
	port, _ := strconv.Atoi(envoy.URL[strings.LastIndex(envoy.URL, ":")+1:])
	var mm messages.Metrics
	h := New(Config{EnvoyPort: port}, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), &mm)
	defer h.CloseIdleConnections()
	answer := func(accept string) (expfmt.FormatType, string) {
		req := httptest.NewRequest(http.MethodGet, "/stats/prometheus", nil)
		req.Header.Set("Accept", accept)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("Accept %q: answer %d", accept, rec.Code)
		}
		return expfmt.Format(rec.Header().Get("Content-Type")).FormatType(), rec.Body.String()
	}
	// Prometheus 3's default Accept.
	prometheus3 := "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4," +
		"text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
	for _, accept := range []string{prometheus3, "application/openmetrics-text;version=1.0.0,*/*;q=0.1"} {
		if ft, body := answer(accept); ft != expfmt.TypeTextPlain || body != envoyBody {
			t.Errorf("Accept %q: %v answer %q, want Envoy's text as it came", accept, ft, body)
		}
	}
	if ft, body := answer("application/openmetrics-text;version=1.0.0"); ft != expfmt.TypeOpenMetrics || !strings.HasSuffix(body, "# EOF\n") {
		t.Errorf("an OpenMetrics-only caller got %v:\n%s", ft, body)
	}
}
