package metricsmerge

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"

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

// changingSource serves, on each request, the body its query names
// (?body=long or short), so that consecutive and concurrent scrapes get
// bodies of different lengths through the same pooled buffers.
func changingSource(t *testing.T, bodies map[string]string) int {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, bodies[r.URL.Query().Get("body")])
	}))
	t.Cleanup(srv.Close)
	port, _ := strconv.Atoi(srv.URL[strings.LastIndex(srv.URL, ":")+1:])
	return port
}

// staticGatherer hands out the same families on every Gather, as a
// Gatherer may: the handler must copy them to prefix their names (#36:
// the prefixed names are now made once and shared between scrapes).
type staticGatherer []*dto.MetricFamily

func (g staticGatherer) Gather() ([]*dto.MetricFamily, error) { return g, nil }

// Each scrape answers its own sources' bodies and nothing of another's,
// whether scrapes follow each other (a long body, then a short one, through
// the buffers pooled between scrapes) or run at once with different
// Accept headers (negotiated once per distinct header, #36); the agent's
// families keep one prefix however many scrapes prefix them.
func TestScrapesShareNothing(t *testing.T) {
	long := "# TYPE envoy_long counter\n" + strings.Repeat("envoy_long{cluster=\"a-cluster-with-a-long-name\"} 1\n", 2000)
	short := "# TYPE envoy_short gauge\nenvoy_short 2\n"
	port := changingSource(t, map[string]string{"long": long, "short": short})
	restarts := 3.0
	agent := staticGatherer{{
		Name: proto.String("restarts_total"), Help: proto.String("Restarts."), Type: dto.MetricType_COUNTER.Enum(),
		Metric: []*dto.Metric{{Counter: &dto.Counter{Value: &restarts}}},
	}}
	var mm messages.Metrics
	h := New(Config{EnvoyPort: port}, agent, slog.New(slog.DiscardHandler), &mm)
	defer h.CloseIdleConnections()
	agentText := "# HELP istio_agent_restarts_total Restarts.\n# TYPE istio_agent_restarts_total counter\nistio_agent_restarts_total 3\n"
	textAccept := "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2"
	omAccept := "application/openmetrics-text;version=1.0.0"
	answer := func(body, accept string) (expfmt.FormatType, string) {
		req := httptest.NewRequest(http.MethodGet, "/stats/prometheus?body="+body, nil)
		req.Header.Set("Accept", accept)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Errorf("?body=%s, Accept %q: answer %d", body, accept, rec.Code)
		}
		return expfmt.Format(rec.Header().Get("Content-Type")).FormatType(), rec.Body.String()
	}
	check := func(body, accept string) {
		ft, got := answer(body, accept)
		bodies := map[string]string{"long": long, "short": short}
		switch accept {
		case textAccept:
			if want := agentText + bodies[body]; ft != expfmt.TypeTextPlain || got != want {
				t.Errorf("?body=%s in text: %v answer of %d bytes, want the agent's and Envoy's %d bytes as they came:\n%.300s",
					body, ft, len(got), len(want), got)
			}
		case omAccept:
			other := map[string]string{"long": "envoy_short", "short": "envoy_long"}[body]
			if ft != expfmt.TypeOpenMetrics || !strings.HasPrefix(got, "# HELP istio_agent_restarts Restarts.\n") ||
				!strings.Contains(got, "envoy_"+body) || strings.Contains(got, other) || !strings.HasSuffix(got, "# EOF\n") {
				t.Errorf("?body=%s in OpenMetrics: %v answer:\n%.300s", body, ft, got)
			}
		}
	}
	for range 3 {
		check("long", textAccept)
		check("short", textAccept)
		check("long", omAccept)
		check("short", omAccept)
	}
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for j := range 10 {
				check([]string{"long", "short"}[(i+j)%2], []string{textAccept, omAccept}[i%2])
			}
		})
	}
	wg.Wait()
	if agent[0].GetName() != "restarts_total" {
		t.Errorf("the Gatherer's own family was renamed %q", agent[0].GetName())
	}
}
