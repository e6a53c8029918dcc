package status

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// requestLines is an exposition of a request counter for n peers, ~1 kB a
// line: what grows with a sidecar's traffic (istio#29110) or a service's
// URIs (Micrometer's http_server_requests).
func requestLines(family string, first, n int) string {
	var b strings.Builder
	if first == 0 {
		fmt.Fprintf(&b, "# TYPE %s counter\n", family)
	}
	var labels strings.Builder
	for l := range 24 {
		fmt.Fprintf(&labels, `label_%d="values as long as Istio's",`, l)
	}
	for i := first; i < first+n; i++ {
		fmt.Fprintf(&b, "%s{response_code=\"200\",source_workload=\"sleep-%d\",%s} %d\n", family, i, labels.String(), i)
	}
	return b.String()
}

// busyEnvoy is Istio's request counter for n peers (requestLines).
func busyEnvoy(first, n int) string { return requestLines("istio_requests_total", first, n) }

// heldBack is a source that answers first, then holds the rest back until
// the caller of the merged endpoint has had a line of the first (release),
// and says what released it.
type heldBack struct {
	first, rest string
	release     chan struct{}
	releasedBy  chan string
}

func newHeldBack(first, rest string) *heldBack {
	return &heldBack{first: first, rest: rest, release: make(chan struct{}), releasedBy: make(chan string, 1)}
}

func (h *heldBack) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	io.WriteString(w, h.first)
	w.(http.Flusher).Flush()
	select {
	case <-h.release:
		h.releasedBy <- "the caller"
	case <-time.After(30 * time.Second):
		h.releasedBy <- "the time-out: the caller had nothing of it before its answer ended"
	case <-r.Context().Done():
		h.releasedBy <- "none: the agent gave up on it"
		return
	}
	io.WriteString(w, h.rest)
}

// scrapeReleasing scrapes url uncompressed (a compressor holds what it has
// not yet sent) and releases h once the answer has had the line marker.
func scrapeReleasing(t *testing.T, url string, h *heldBack, marker string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "60")
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got strings.Builder
	lines := bufio.NewReader(resp.Body)
	for {
		line, err := lines.ReadString('\n')
		got.WriteString(line)
		if line == marker {
			close(h.release)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if by := <-h.releasedBy; by != "the caller" {
		t.Fatalf("the held-back answer was released by %s", by)
	}
	return got.String()
}

// Envoy's exposition is streamed into the answer, as Istio's agent copies
// it: the caller has Envoy's first lines before Envoy has sent the rest. Holding it whole cost a busy pod twice its exposition (#36).
func TestMergedMetricsStreamEnvoysAnswer(t *testing.T) {
	first, rest := busyEnvoy(0, 300), busyEnvoy(300, 300)
	envoy := newHeldBack(first, rest)
	envoySrv := httptest.NewServer(envoy)
	defer envoySrv.Close()
	app := &exposition{contentType: "text/plain; version=0.0.4", body: []byte("# TYPE app_up gauge\napp_up 1\n")}
	base := serveSources(t, portOf(t, envoySrv.URL), serveExposition(t, app))

	// A line 200 lines (~190 kB) before the end of Envoy's first part: the
	// agent holds at most a window (64 kB) of it.
	body := scrapeReleasing(t, base+"/stats/prometheus", envoy, busyEnvoy(100, 1))
	if !strings.Contains(body, first+rest) || !strings.HasSuffix(body, "app_up 1\n") {
		t.Errorf("the answer does not hold Envoy's exposition as it came, then the application's")
	}
	checkWhole(t, body, "istio_requests_total", 600)
}

// An application's text exposition longer than 64 KiB is streamed too,
// after Envoy's, as Istio's agent copies it: a JVM service's runs to
// megabytes, and holding it cost its pod that much between scrapes (#36).
func TestMergedMetricsStreamApplicationsAnswer(t *testing.T) {
	first, rest := requestLines("http_server_requests_total", 0, 400), requestLines("http_server_requests_total", 400, 200)
	app := newHeldBack(first, rest)
	appSrv := httptest.NewServer(app)
	defer appSrv.Close()
	envoy := &exposition{contentType: "text/plain; version=0.0.4", body: envoyExposition(t)}
	base := serveSources(t, serveExposition(t, envoy), portOf(t, appSrv.URL))

	// A line past the 64 KiB held (~1 kB a line), and 100 lines before the
	// end of the first part: the agent holds at most a window (64 kB) of it.
	body := scrapeReleasing(t, base+"/stats/prometheus", app, requestLines("http_server_requests_total", 300, 1))
	if !strings.HasSuffix(body, first+rest) || !strings.Contains(body, string(envoy.body)) {
		t.Errorf("the answer does not end with Envoy's exposition then the application's, as they came")
	}
	checkWhole(t, body, "http_server_requests_total", 600)
}

// checkWhole checks that a streamed answer parses strictly, with the
// agent's families and n series of the streamed family.
func checkWhole(t *testing.T, body, family string, n int) {
	t.Helper()
	fams := parseText(t, body)
	promtoolCheck(t, body)
	if got := len(fams[family].GetMetric()); got != n {
		t.Errorf("%s: %d series, want %d", family, got, n)
	}
	testkit.MetricSample(t, fams, "istio_agent_meshagent_service_restarts_total", "service", "dns")
}

// What Envoy's stream cannot pass as it came: a family of the agent's or a
// second part of one of Envoy's is left out (logged once), a family an
// application also has is merged with the application's, and a line that
// does not parse ends Envoy's part there, counted as a failure. The answer
// parses strictly every time.
func TestMergedMetricsStreamedFamiliesThatClash(t *testing.T) {
	pad := busyEnvoy(0, 100) // past the first window (64 kB): the bad line is in the second
	envoy := &exposition{contentType: "text/plain; version=0.0.4",
		body: clashingExposition("envoy", "# TYPE shared_total counter\nshared_total{from=\"envoy\"} 1\nshared_total{from=\"both\"} 2\n", pad)}
	app := &exposition{contentType: "text/plain; version=0.0.4", body: []byte("# TYPE shared_total counter\nshared_total{from=\"app\"} 4\nshared_total{from=\"both\"} 5\n")}
	logs := scrapeTwice(t, envoy, app, func(body string, fams testkit.Families) {
		checkLeftOut(t, fams, "envoy")
		shared := fams["shared_total"]
		if shared.GetType() != dto.MetricType_COUNTER || len(shared.GetMetric()) != 3 || testkit.MetricSample(t, fams, "shared_total", "from", "both") != 2 {
			t.Errorf("shared_total: %v with %d series, want a counter of envoy, both (Envoy's 2), app:\n%s", shared.GetType(), len(shared.GetMetric()), body)
		}
		if n := len(fams["istio_requests_total"].GetMetric()); n != 100 {
			t.Errorf("istio_requests_total: %d series, want 100", n)
		}
	})
	checkLoggedOnce(t, logs, "istio_agent_scrapes_total", "envoy_split_total")

	// A line that does not parse, in the second window: Envoy's part ends
	// before it, the rest of the answer comes, the failure is counted.
	bad := &exposition{contentType: "text/plain; version=0.0.4",
		body: []byte("# TYPE envoy_before gauge\nenvoy_before 1\n" + pad + "this is { not metrics\nenvoy_after 2\n")}
	base := serveMerged(t, bad, app)
	_, body := scrape(t, base+"/stats/prometheus", nil)
	fams := parseText(t, body)
	if _, ok := fams["envoy_after"]; ok || testkit.MetricSample(t, fams, "envoy_before") != 1 {
		t.Errorf("Envoy's part is not cut before the bad line")
	}
	testkit.MetricSample(t, fams, "shared_total", "from", "app")
	_, body = scrape(t, base+"/stats/prometheus", nil)
	if v := testkit.MetricSample(t, parseText(t, body), "istio_agent_scrape_failures_total", "type", "envoy"); v != 1 {
		t.Errorf("envoy failures = %v, want 1", v)
	}
}

// A streamed application's exposition cannot be merged: a family the
// answer already has (the agent's, Envoy's) or a second part of its own
// is left out and logged once, and the answer parses strictly. An answer
// that is not text reads it whole and merges it as before.
func TestMergedMetricsStreamedApplicationsFamiliesThatClash(t *testing.T) {
	pad := requestLines("app_requests_total", 0, 300) // past the 64 KiB held
	app := &exposition{contentType: "text/plain; version=0.0.4",
		body: clashingExposition("app", "# TYPE shared_total counter\nshared_total{from=\"app\"} 4\n", pad)}
	envoy := &exposition{contentType: "text/plain; version=0.0.4", body: []byte("# TYPE shared_total counter\nshared_total{from=\"envoy\"} 1\n")}
	logs := scrapeTwice(t, envoy, app, func(body string, fams testkit.Families) {
		if shared := fams["shared_total"]; len(shared.GetMetric()) != 1 || testkit.MetricSample(t, fams, "shared_total", "from", "envoy") != 1 {
			t.Errorf("shared_total: %v, want Envoy's one series:\n%.2000s", shared.GetMetric(), body)
		}
		checkLeftOut(t, fams, "app")
		if n := len(fams["app_requests_total"].GetMetric()); n != 300 {
			t.Errorf("app_requests_total: %d series, want 300", n)
		}
	})
	checkLoggedOnce(t, logs, "shared_total", "istio_agent_scrapes_total", "app_split_total")

	// OpenMetrics asked, and Envoy's answer is OpenMetrics: the answer is
	// OpenMetrics, so the application's is read whole and merged.
	envoy = &exposition{contentType: string(expfmt.FmtOpenMetrics_1_0_0), body: []byte("# TYPE shared counter\nshared_total{from=\"envoy\"} 1\n# EOF\n")}
	base := serveMerged(t, envoy, app)
	resp, body := scrape(t, base+"/stats/prometheus", http.Header{"Accept": {string(expfmt.FmtOpenMetrics_1_0_0)}})
	if expfmt.Format(resp.Header.Get("Content-Type")).FormatType() != expfmt.TypeOpenMetrics {
		t.Fatalf("Content-Type %q, want OpenMetrics", resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{`shared_total{from="envoy"} 1.0`, `shared_total{from="app"} 4.0`, `app_split_total{part="2"} 2.0`, "app_after_split 3.0"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("the OpenMetrics answer has no %s", want)
		}
	}
	if n := strings.Count(body, "app_requests_total{"); n != 300 {
		t.Errorf("the OpenMetrics answer has %d app_requests_total series, want 300", n)
	}
}

// clashingExposition is a source's exposition that a stream cannot pass as
// it came: first, then a family of the agent's, a family split around pad
// (<source>_split_total, parts 1 and 2) and <source>_after_split.
func clashingExposition(source, first, pad string) []byte {
	return []byte(first + `# TYPE istio_agent_scrapes_total counter
istio_agent_scrapes_total{from="` + source + `"} 9
# TYPE ` + source + `_split_total counter
` + source + `_split_total{part="1"} 1
` + pad + `# TYPE ` + source + `_split_total counter
` + source + `_split_total{part="2"} 2
# TYPE ` + source + `_after_split gauge
` + source + `_after_split 3
`)
}

// checkLeftOut checks that a streamed clashingExposition left its lines of
// the agent's family and its split's second part out, and went on after.
func checkLeftOut(t *testing.T, fams testkit.Families, source string) {
	t.Helper()
	if scrapes := fams["istio_agent_scrapes_total"]; len(scrapes.GetMetric()) != 1 || len(scrapes.GetMetric()[0].GetLabel()) != 0 {
		t.Errorf("istio_agent_scrapes_total: %v, want the agent's one series, not the %s's", scrapes.GetMetric(), source)
	}
	split := source + "_split_total"
	if f := fams[split]; len(f.GetMetric()) != 1 || testkit.MetricSample(t, fams, split, "part", "1") != 1 {
		t.Errorf("%s: %d series, want its first part's one", split, len(f.GetMetric()))
	}
	if v := testkit.MetricSample(t, fams, source+"_after_split"); v != 3 {
		t.Errorf("the family after the split = %v", v)
	}
}

// scrapeTwice scrapes envoy and app merged twice, each answer parsed
// strictly and given to check, and returns what was logged.
func scrapeTwice(t *testing.T, envoy, app *exposition, check func(body string, fams testkit.Families)) string {
	t.Helper()
	var logs testkit.LogBuffer
	base := serveMergedLogged(t, envoy, app, &logs)
	for range 2 {
		check(strictScrape(t, base+"/stats/prometheus"))
	}
	return logs.String()
}

// checkLoggedOnce checks that each family's leaving out was logged once
// over the scrapes.
func checkLoggedOnce(t *testing.T, logs string, families ...string) {
	t.Helper()
	for _, family := range families {
		key := "family=" + family
		if n := strings.Count(logs, key+" ") + strings.Count(logs, key+"\n"); n != 1 {
			t.Errorf("%s logged %d times, want once:\n%s", family, n, logs)
		}
	}
}
