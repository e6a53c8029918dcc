package status

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/services/status/metricsmerge"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// envoyExposition is the stand-in Envoy's /stats/prometheus.
func envoyExposition(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/envoy-stats.prom")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// exposition serves a fixed body as the given content type and records the
// requests it gets.
type exposition struct {
	contentType string
	body        []byte
	status      int
	requests    atomic.Int32
	lastQuery   atomic.Value
	lastTimeout atomic.Value
	lastAccept  atomic.Value
}

func (e *exposition) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.requests.Add(1)
	e.lastQuery.Store(r.URL.RawQuery)
	e.lastTimeout.Store(r.Header.Get("X-Prometheus-Scrape-Timeout-Seconds"))
	e.lastAccept.Store(r.Header.Get("Accept"))
	w.Header().Set("Content-Type", e.contentType)
	if e.status != 0 {
		w.WriteHeader(e.status)
	}
	_, _ = w.Write(e.body)
}

func serveExposition(t testing.TB, e *exposition) int {
	t.Helper()
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return portOf(t, srv.URL)
}

// openMetricsApp is an application that answers OpenMetrics whatever it is
// asked, as some client libraries do: a counter with _created lines, a
// histogram, a gauge with a unit.
func openMetricsApp(t testing.TB) []byte {
	t.Helper()
	reg := prometheus.NewRegistry()
	orders := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shop_orders_total", Help: "Orders taken."}, []string{"kind"})
	orders.WithLabelValues("book").Add(7)
	orders.WithLabelValues("pen").Add(2)
	latency := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shop_latency_seconds", Help: "Latency.", Buckets: []float64{0.1, 1}})
	latency.Observe(0.05)
	latency.Observe(0.5)
	queue := prometheus.NewGauge(prometheus.GaugeOpts{Name: "shop_queue_bytes", Help: "Queue size."})
	queue.Set(42)
	reg.MustRegister(orders, latency, queue)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	enc := expfmt.NewEncoder(&sb, expfmt.FmtOpenMetrics_1_0_0, expfmt.WithCreatedLines())
	for _, f := range fams {
		if f.GetName() == "shop_queue_bytes" {
			f.Unit = proto.String("bytes") // a # UNIT line
		}
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	_ = enc.(expfmt.Closer).Close()
	return []byte(sb.String())
}

// agentRegistry is an agent registry as the tree makes it.
func agentRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_service_restarts_total", Help: "Restarts."}, []string{"service"})
	c.WithLabelValues("dns").Add(3)
	reg.MustRegister(c)
	return reg
}

// scrape GETs the merged endpoint with the given headers.
func scrape(t *testing.T, url string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	// DisableCompression: see gzip as the wire carries it.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// parseText is the strict reading promtool and many tools use: one family
// per name, TYPE lines before samples.
func parseText(t *testing.T, body string) testkit.Families {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("merged metrics do not parse: %v\n%s", err, body)
	}
	return fams
}

// strictScrape scrapes url and reads the answer as parseText and promtool
// do.
func strictScrape(t *testing.T, url string) (string, testkit.Families) {
	t.Helper()
	_, body := scrape(t, url, nil)
	fams := parseText(t, body)
	promtoolCheck(t, body)
	return body, fams
}

// promtoolCheck runs promtool check metrics, if installed: exit 3 is lint
// findings alone (Envoy's families have no HELP), anything else fails.
func promtoolCheck(t *testing.T, body string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not installed (Debian package prometheus): promtool check skipped")
		return
	}
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = strings.NewReader(body)
	out, err := check.CombinedOutput()
	if err != nil && (check.ProcessState.ExitCode() != 3 || strings.Contains(string(out), "error while linting")) {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// serveMerged serves the agent's registry (agentRegistry) merged with
// Envoy's exposition and the application's, and returns the base URL.
func serveMerged(t *testing.T, envoy, app *exposition) string {
	t.Helper()
	return serveSources(t, serveExposition(t, envoy), serveExposition(t, app))
}

// serveSources serves the agent's registry (agentRegistry) merged with
// Envoy's exposition on envoyPort and the application's on appPort.
func serveSources(t *testing.T, envoyPort, appPort int) string {
	t.Helper()
	return newFixtureIn(mergedConfig(envoyPort, appPort), Inputs{Metrics: agentRegistry()}).serve(t)
}

// mergedConfig merges Envoy's exposition on envoyPort and the
// application's /metrics on appPort.
func mergedConfig(envoyPort, appPort int) Config {
	return Config{Metrics: metricsmerge.Config{
		EnvoyPort: envoyPort,
		App:       []metricsmerge.ScrapeTarget{{Port: appPort, Path: "/metrics"}},
	}}
}

// serveMergedLogged is serveMerged with the fixture's own registry,
// logging at Info into logs.
func serveMergedLogged(t *testing.T, envoy, app *exposition, logs io.Writer) string {
	t.Helper()
	return newLoggedFixture(mergedConfig(serveExposition(t, envoy), serveExposition(t, app)), infoLogger(logs)).serve(t)
}

// The merged endpoint: the agent's metrics under Istio's prefix, Envoy's,
// then an OpenMetrics-only application's, as one exposition that strict
// parsers and promtool accept.
func TestMergedMetrics(t *testing.T) {
	envoy := &exposition{contentType: "text/plain; version=0.0.4", body: envoyExposition(t)}
	app := &exposition{contentType: string(expfmt.FmtOpenMetrics_1_0_0), body: openMetricsApp(t)}
	base := serveMerged(t, envoy, app)

	for _, path := range []string{"/stats/prometheus", "/metrics"} {
		resp, body := scrape(t, base+path+"?usedonly", nil)
		if resp.StatusCode != 200 || expfmt.Format(resp.Header.Get("Content-Type")).FormatType() != expfmt.TypeTextPlain {
			t.Fatalf("%s = %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		fams := parseText(t, body)
		promtoolCheck(t, body)
		if v := testkit.MetricSample(t, fams, "istio_agent_meshagent_service_restarts_total", "service", "dns"); v != 3 {
			t.Errorf("agent counter = %v", v)
		}
		testkit.MetricSample(t, fams, "istio_agent_go_goroutines")
		testkit.MetricSample(t, fams, "istio_agent_scrapes_total")
		if v := testkit.MetricSample(t, fams, "envoy_cluster_upstream_cx_total", "cluster_name", "agent"); v != 2 {
			t.Errorf("envoy counter = %v", v)
		}
		if v := testkit.MetricSample(t, fams, "istio_request_duration_milliseconds", "response_code", "200"); v != 9 {
			t.Errorf("istio histogram count = %v", v)
		}
		if fams["envoy_fake_untyped_samples"].GetType() != dto.MetricType_UNTYPED {
			t.Errorf("Envoy's untyped family came out as %v", fams["envoy_fake_untyped_samples"].GetType())
		}
		if v := testkit.MetricSample(t, fams, "shop_orders_total", "kind", "book"); v != 7 || fams["shop_orders_total"].GetType() != dto.MetricType_COUNTER {
			t.Errorf("application counter = %v (%v)", v, fams["shop_orders_total"].GetType())
		}
		if v := testkit.MetricSample(t, fams, "shop_latency_seconds"); v != 2 {
			t.Errorf("application histogram count = %v", v)
		}
		if strings.Contains(body, "_created") || strings.Contains(body, "# EOF") {
			t.Errorf("OpenMetrics-only lines leaked into the text exposition")
		}
		// Istio's order: the agent's, Envoy's, the application's.
		agentAt, envoyAt, appAt := strings.Index(body, "istio_agent_"), strings.Index(body, "envoy_"), strings.Index(body, "shop_")
		if agentAt >= envoyAt || envoyAt >= appAt {
			t.Errorf("order: agent at %d, Envoy at %d, application at %d", agentAt, envoyAt, appAt)
		}
	}
	if q, _ := envoy.lastQuery.Load().(string); q != "usedonly" {
		t.Errorf("Envoy was asked with query %q, want the caller's %q", q, "usedonly")
	}
	if a, _ := app.lastAccept.Load().(string); !strings.Contains(a, "text/plain") || !strings.Contains(a, "openmetrics") {
		t.Errorf("application was asked to Accept %q", a)
	}
}

// Text sources that strict parsers accept and that share no family are
// passed on as they came (Envoy's "{}" survives, which re-encoding drops),
// and the whole still parses.
func TestMergedMetricsPassCleanSourcesThrough(t *testing.T) {
	envoy := &exposition{contentType: "text/plain; version=0.0.4", body: envoyExposition(t)}
	app := &exposition{contentType: "text/plain; version=0.0.4", body: []byte("# HELP app_up Up.\n# TYPE app_up gauge\napp_up 1")}
	base := serveMerged(t, envoy, app)
	body, fams := strictScrape(t, base+"/stats/prometheus")
	if !strings.Contains(body, string(envoyExposition(t))) {
		t.Error("Envoy's exposition is not in the answer as it came")
	}
	if !strings.HasSuffix(body, "app_up 1\n") {
		t.Errorf("the application's body (without a final newline) does not end the answer: %q", body[max(0, len(body)-40):])
	}
	testkit.MetricSample(t, fams, "istio_agent_meshagent_service_restarts_total", "service", "dns")
	testkit.MetricSample(t, fams, "envoy_server_state")
}

// A family two sources both expose comes out once; untyped samples join
// their typed family; a family whose types cannot be reconciled keeps the
// first source's and says so once.
func TestMergedMetricsReconcileFamilies(t *testing.T) {
	envoy := &exposition{contentType: "text/plain; version=0.0.4", body: []byte(`# TYPE shared_total counter
shared_total{from="envoy"} 1
shared_total{from="both"} 2
# TYPE clash_seconds histogram
clash_seconds_bucket{le="1"} 1
clash_seconds_bucket{le="+Inf"} 1
clash_seconds_sum 0.5
clash_seconds_count 1
# TYPE shared_total counter
shared_total{from="envoy-again"} 3
`)}
	app := &exposition{contentType: "text/plain", body: []byte(`shared_total{from="app"} 4
shared_total{from="both"} 5
# TYPE clash_seconds gauge
clash_seconds 9
late_gauge{x="1"} 1
# TYPE late_gauge gauge
late_gauge{x="2"} 2
`)}
	var logs testkit.LogBuffer
	base := serveMergedLogged(t, envoy, app, &logs)
	for range 2 {
		body, fams := strictScrape(t, base+"/stats/prometheus")
		shared := fams["shared_total"]
		if shared.GetType() != dto.MetricType_COUNTER || len(shared.GetMetric()) != 4 {
			t.Fatalf("shared_total: %v with %d series, want a counter with envoy, both, envoy-again, app:\n%s", shared.GetType(), len(shared.GetMetric()), body)
		}
		if v := testkit.MetricSample(t, fams, "shared_total", "from", "both"); v != 2 {
			t.Errorf("a series both sources have = %v, want the first source's 2", v)
		}
		// A TYPE line after samples of its family (expfmt refuses the
		// whole body; Prometheus reads it).
		if late := fams["late_gauge"]; late.GetType() != dto.MetricType_GAUGE || len(late.GetMetric()) != 2 {
			t.Errorf("late_gauge: %v with %d series, want one gauge family with both", late.GetType(), len(late.GetMetric()))
		}
		if fams["clash_seconds"].GetType() != dto.MetricType_HISTOGRAM {
			t.Errorf("clash_seconds = %v, want Envoy's histogram", fams["clash_seconds"].GetType())
		}
	}
	if n := strings.Count(logs.String(), "family=clash_seconds"); n != 1 {
		t.Errorf("the refused family was logged %d times over 2 scrapes, want once:\n%s", n, logs.String())
	}
}

// A source that is down, answers an error, answers garbage or too much is
// left out and counted; the scrape still answers 200 with the rest.
func TestMergedMetricsSurviveFailingSources(t *testing.T) {
	app := &exposition{contentType: "text/plain", body: []byte("app_up 1\n")}
	broken := &exposition{status: http.StatusInternalServerError}
	garbage := &exposition{contentType: "text/plain", body: []byte("this is { not metrics\n")}
	huge := &exposition{contentType: "text/plain", body: []byte("big_series " + strings.Repeat("1", 2000) + "\n")}
	reg := agentRegistry()
	f := newFixtureIn(Config{Metrics: metricsmerge.Config{
		EnvoyPort: closedPort(t),
		App: []metricsmerge.ScrapeTarget{
			{Port: serveExposition(t, app), Path: "/metrics"},
			{Port: serveExposition(t, broken), Path: "/metrics"},
			{Port: serveExposition(t, garbage), Path: "/metrics"},
			{Port: serveExposition(t, huge), Path: "/metrics"},
		},
		BodyLimit: 1000,
	}}, Inputs{Metrics: reg})
	base := f.serve(t)
	for round := 1; round <= 2; round++ {
		resp, body := scrape(t, base+"/stats/prometheus", nil)
		if resp.StatusCode != 200 {
			t.Fatalf("scrape with failing sources = %d", resp.StatusCode)
		}
		fams := parseText(t, body)
		if v := testkit.MetricSample(t, fams, "app_up"); v != 1 {
			t.Errorf("the working application's metric = %v", v)
		}
		testkit.MetricSample(t, fams, "istio_agent_meshagent_service_restarts_total", "service", "dns")
		if _, ok := fams["big_series"]; ok {
			t.Error("an answer over the body limit was merged")
		}
		// This scrape's failures are counted before its own metrics are
		// gathered, so they show in the next scrape.
		if v := testkit.MetricSample(t, fams, "istio_agent_scrape_failures_total", "type", "envoy"); v != float64(round-1) {
			t.Errorf("round %d: envoy failures = %v, want %d", round, v, round-1)
		}
		if v := testkit.MetricSample(t, fams, "istio_agent_scrape_failures_total", "type", "application"); v != float64(3*(round-1)) {
			t.Errorf("round %d: application failures = %v, want %d", round, v, 3*(round-1))
		}
		if v := testkit.MetricSample(t, fams, "istio_agent_scrapes_total"); v != float64(round) {
			t.Errorf("round %d: scrapes_total = %v", round, v)
		}
	}
}

// The sources get the caller's scrape timeout (less what the merge keeps);
// one that does not answer within it is left out, and the scrape answers.
func TestMergedMetricsTimeoutLeavesSlowSourceOut(t *testing.T) {
	app := &exposition{contentType: "text/plain", body: []byte("app_up 1\n")}
	var hungTimeout atomic.Value
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hungTimeout.Store(r.Header.Get("X-Prometheus-Scrape-Timeout-Seconds"))
		<-r.Context().Done()
	}))
	defer hung.Close()
	reg := prometheus.NewRegistry()
	base := newFixtureIn(mergedConfig(portOf(t, hung.URL), serveExposition(t, app)), Inputs{Metrics: reg}).serve(t)
	resp, body := scrape(t, base+"/stats/prometheus", http.Header{"X-Prometheus-Scrape-Timeout-Seconds": {"1"}})
	if resp.StatusCode != 200 {
		t.Fatalf("scrape = %d", resp.StatusCode)
	}
	testkit.MetricSample(t, parseText(t, body), "app_up")
	got, _ := hungTimeout.Load().(string)
	if secs, err := strconv.ParseFloat(got, 64); err != nil || secs <= 0 || secs > 1 {
		t.Errorf("the source was told X-Prometheus-Scrape-Timeout-Seconds %q, want (0, 1]", got)
	}
	if s := app.lastTimeout.Load(); s != got {
		t.Errorf("sources were told different timeouts: %v and %v", s, got)
	}
	_, body = scrape(t, base+"/stats/prometheus", http.Header{"X-Prometheus-Scrape-Timeout-Seconds": {"0.5"}})
	if v := testkit.MetricSample(t, parseText(t, body), "istio_agent_scrape_failures_total", "type", "envoy"); v < 1 {
		t.Errorf("the timed-out source was not counted as failed")
	}
}

// OpenMetrics when the caller asks for it (Prometheus does, first), with
// its EOF; text otherwise.
func TestMergedMetricsOpenMetricsNegotiation(t *testing.T) {
	envoy := &exposition{contentType: "text/plain; version=0.0.4", body: envoyExposition(t)}
	app := &exposition{contentType: string(expfmt.FmtOpenMetrics_1_0_0), body: openMetricsApp(t)}
	base := serveMerged(t, envoy, app)
	// Prometheus 3's default Accept.
	accept := "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4," +
		"text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
	resp, body := scrape(t, base+"/stats/prometheus", http.Header{"Accept": {accept}})
	if ft := expfmt.Format(resp.Header.Get("Content-Type")).FormatType(); ft != expfmt.TypeOpenMetrics {
		t.Fatalf("Content-Type %q for an OpenMetrics scraper", resp.Header.Get("Content-Type"))
	}
	if !strings.HasSuffix(body, "# EOF\n") || strings.Count(body, "# EOF") != 1 {
		t.Fatalf("OpenMetrics body does not end with one # EOF:\n%s", body[max(0, len(body)-200):])
	}
	// That the answer parses, each family once with its type, is
	// metricsmerge's TestOpenMetricsAnswer.
	for _, want := range []string{"# TYPE istio_agent_meshagent_service_restarts counter", "# TYPE envoy_cluster_upstream_cx_connect_ms histogram", "# TYPE shop_orders counter"} {
		if !strings.Contains(body, want) {
			t.Errorf("OpenMetrics answer lacks %q", want)
		}
	}
	resp, _ = scrape(t, base+"/stats/prometheus", http.Header{"Accept": {"text/plain;version=0.0.4"}})
	if ft := expfmt.Format(resp.Header.Get("Content-Type")).FormatType(); ft != expfmt.TypeTextPlain {
		t.Fatalf("Content-Type %q for a text scraper", resp.Header.Get("Content-Type"))
	}
}

// decoders read an answer by its Content-Encoding.
var decoders = map[string]func(io.Reader) (io.Reader, error){
	"":     func(r io.Reader) (io.Reader, error) { return r, nil },
	"gzip": func(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) },
	"zstd": func(r io.Reader) (io.Reader, error) {
		d, err := zstd.NewReader(r)
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	},
}

// Compression as Istio's status server (gzhttp over the whole mux, #35):
// zstd or gzip by Accept-Encoding, zstd when both are equally welcome, none
// when refused; a zstd scrape decodes and parses, for expfmt and promtool.
func TestCompressedAnswers(t *testing.T) {
	f := newFixtureIn(Config{}, Inputs{Metrics: agentRegistry()})
	base := f.serve(t)
	for _, c := range []struct{ accept, want string }{
		{"zstd", "zstd"},
		{"gzip", "gzip"},
		{"gzip, deflate, br, zstd", "zstd"}, // a browser's: equal q, zstd preferred
		{"zstd;q=0.5, gzip", "gzip"},
		{"gzip;q=0, identity", ""},
		{"", ""},
	} {
		resp, body := scrape(t, base+"/stats/prometheus", http.Header{"Accept-Encoding": {c.accept}})
		if got := resp.Header.Get("Content-Encoding"); got != c.want {
			t.Errorf("Accept-Encoding %q: Content-Encoding %q, want %q", c.accept, got, c.want)
			continue
		}
		if !slices.Contains(resp.Header.Values("Vary"), "Accept-Encoding") {
			t.Errorf("Accept-Encoding %q: no Vary: Accept-Encoding (%q)", c.accept, resp.Header.Values("Vary"))
		}
		r, err := decoders[c.want](strings.NewReader(body))
		if err != nil {
			t.Fatalf("Accept-Encoding %q: %v", c.accept, err)
		}
		plain, err := io.ReadAll(r)
		if err != nil {
			t.Fatalf("Accept-Encoding %q: decoding the %s answer: %v", c.accept, c.want, err)
		}
		testkit.MetricSample(t, parseText(t, string(plain)), "istio_agent_meshagent_service_restarts_total", "service", "dns")
		if c.want == "zstd" {
			promtoolCheck(t, string(plain))
		}
	}
	// Every endpoint, not only the metrics: the index is compressed, a
	// readiness answer under gzhttp's 1 KiB is not.
	for path, want := range map[string]string{"/": "zstd", "/healthz/ready": ""} {
		resp, _ := scrape(t, base+path, http.Header{"Accept-Encoding": {"zstd, gzip"}})
		if got := resp.Header.Get("Content-Encoding"); got != want {
			t.Errorf("GET %s: Content-Encoding %q, want %q", path, got, want)
		}
	}
}

// Compressed scrapes decode to the plain answer, byte for byte, one after
// another and as many at once as the server takes (classMetrics): gzip's
// stateless level shares no state between answers, zstd's encoders are
// pooled (#36).
func TestCompressedScrapesDecode(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_service_restarts_total", Help: "Restarts."}, []string{"service"})
	c.WithLabelValues("dns").Add(3)
	reg.MustRegister(c)
	envoy := &exposition{contentType: "text/plain; version=0.0.4", body: envoyExposition(t)}
	f := newFixtureIn(Config{Metrics: metricsmerge.Config{EnvoyPort: serveExposition(t, envoy)}}, Inputs{Metrics: reg})
	base := f.serve(t)
	// scrapes_total is the one value that moves between scrapes.
	steady := func(body string) string {
		var sb strings.Builder
		for line := range strings.Lines(body) {
			if !strings.HasPrefix(line, "istio_agent_scrapes_total ") {
				sb.WriteString(line)
			}
		}
		return sb.String()
	}
	_, plain := scrape(t, base+"/stats/prometheus", http.Header{})
	plain = steady(plain)
	if len(plain) < 20000 {
		t.Fatalf("a plain answer of %d bytes: want Envoy's whole exposition in it", len(plain))
	}
	check := func(encoding string) error {
		req, err := http.NewRequest(http.MethodGet, base+"/stats/prometheus", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Accept-Encoding", encoding)
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}}).Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if got := resp.Header.Get("Content-Encoding"); got != encoding {
			return fmt.Errorf("Content-Encoding %q, want %q", got, encoding)
		}
		r, err := decoders[encoding](resp.Body)
		if err != nil {
			return fmt.Errorf("%s answer: %w", encoding, err)
		}
		got, err := io.ReadAll(r)
		if err != nil {
			return fmt.Errorf("decoding the %s answer: %w", encoding, err)
		}
		if steady(string(got)) != plain {
			return fmt.Errorf("the %s answer decodes to %d bytes other than the plain answer's %d", encoding, len(got), len(plain))
		}
		return nil
	}
	for range 3 {
		for _, enc := range []string{"gzip", "zstd"} {
			if err := check(enc); err != nil {
				t.Fatal(err)
			}
		}
	}
	errs := make(chan error, classMetrics.max*8)
	var wg sync.WaitGroup
	for i := range classMetrics.max {
		wg.Go(func() {
			for range 8 {
				errs <- check([]string{"gzip", "zstd"}[i%2])
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// METRICS_LOCALHOST_ACCESS_ONLY=true refuses other hosts. (A real caller
// from another address is not tried: this machine may only talk to
// loopback addresses.)
func TestMergedMetricsLocalhostOnly(t *testing.T) {
	for _, only := range []bool{false, true} {
		f := newFixtureIn(Config{Metrics: metricsmerge.Config{LocalhostOnly: only}}, Inputs{Metrics: agentRegistry()})
		h := f.svc.routes()
		for addr, local := range map[string]bool{"192.0.2.10:40000": false, "127.0.0.1:40000": true, "[::1]:40000": true} {
			rec := request(h, http.MethodGet, "/stats/prometheus", addr, nil)
			want := http.StatusOK
			if only && !local {
				want = http.StatusForbidden
			}
			if rec.Code != want {
				t.Errorf("LocalhostOnly=%v, caller %s: %d, want %d", only, addr, rec.Code, want)
			}
		}
	}
}
