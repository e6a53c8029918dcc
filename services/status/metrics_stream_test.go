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

	"github.com/meshagent/meshagent/services/status/metricsmerge"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// busyEnvoy is an exposition of Istio's request counter for n peers:
// what grows with a sidecar's traffic (istio#29110), ~1 kB a line.
func busyEnvoy(first, n int) string {
	var b strings.Builder
	if first == 0 {
		b.WriteString("# TYPE istio_requests_total counter\n")
	}
	var labels strings.Builder
	for l := range 24 {
		fmt.Fprintf(&labels, `label_%d="values as long as Istio's",`, l)
	}
	for i := first; i < first+n; i++ {
		fmt.Fprintf(&b, "istio_requests_total{response_code=\"200\",source_workload=\"sleep-%d\",%s} %d\n", i, labels.String(), i)
	}
	return b.String()
}

// Envoy's exposition is streamed into the answer, as Istio's agent copies
// it: the caller has Envoy's first lines before Envoy has sent the rest. Holding it whole cost a busy pod twice its exposition (#36).
func TestMergedMetricsStreamEnvoysAnswer(t *testing.T) {
	first, rest := busyEnvoy(0, 300), busyEnvoy(300, 300)
	callerHasFirst := make(chan struct{})
	releasedBy := make(chan string, 1)
	envoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		io.WriteString(w, first)
		w.(http.Flusher).Flush()
		select {
		case <-callerHasFirst:
			releasedBy <- "the caller"
		case <-time.After(30 * time.Second):
			releasedBy <- "the time-out: the caller had nothing of Envoy's before Envoy's answer ended"
		case <-r.Context().Done():
			releasedBy <- "none: the agent gave up on Envoy"
			return
		}
		io.WriteString(w, rest)
	}))
	defer envoy.Close()
	app := &exposition{contentType: "text/plain; version=0.0.4", body: []byte("# TYPE app_up gauge\napp_up 1\n")}
	base := newFixtureIn(Config{Metrics: metricsmerge.Config{
		EnvoyPort: portOf(t, envoy.URL),
		App:       []metricsmerge.ScrapeTarget{{Port: serveExposition(t, app), Path: "/metrics"}},
	}}, Inputs{Metrics: agentRegistry()}).serve(t)

	// Uncompressed: a compressor holds what it has not yet sent.
	req, err := http.NewRequest(http.MethodGet, base+"/stats/prometheus", nil)
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
	// A line 200 lines (~190 kB) before the end of Envoy's first part: the
	// agent holds at most a window (64 kB) of it.
	marker := busyEnvoy(100, 1)
	for {
		line, err := lines.ReadString('\n')
		got.WriteString(line)
		if line == marker {
			close(callerHasFirst)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if by := <-releasedBy; by != "the caller" {
		t.Fatalf("Envoy's answer was released by %s", by)
	}
	body := got.String()
	if !strings.Contains(body, first+rest) || !strings.HasSuffix(body, "app_up 1\n") {
		t.Errorf("the answer does not hold Envoy's exposition as it came, then the application's")
	}
	fams := parseText(t, body)
	promtoolCheck(t, body)
	if n := len(fams["istio_requests_total"].GetMetric()); n != 600 {
		t.Errorf("istio_requests_total: %d series, want 600", n)
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
	envoy := &exposition{contentType: "text/plain; version=0.0.4", body: []byte(`# TYPE istio_agent_scrapes_total counter
istio_agent_scrapes_total{from="envoy"} 9
# TYPE envoy_split_total counter
envoy_split_total{part="1"} 1
# TYPE shared_total counter
shared_total{from="envoy"} 1
shared_total{from="both"} 2
` + pad + `# TYPE envoy_split_total counter
envoy_split_total{part="2"} 2
# TYPE envoy_after_split gauge
envoy_after_split 3
`)}
	app := &exposition{contentType: "text/plain; version=0.0.4", body: []byte("# TYPE shared_total counter\nshared_total{from=\"app\"} 4\nshared_total{from=\"both\"} 5\n")}
	var logs testkit.LogBuffer
	base := serveMergedLogged(t, envoy, app, &logs)
	for range 2 {
		body, fams := strictScrape(t, base+"/stats/prometheus")
		if scrapes := fams["istio_agent_scrapes_total"]; len(scrapes.GetMetric()) != 1 || len(scrapes.GetMetric()[0].GetLabel()) != 0 {
			t.Errorf("istio_agent_scrapes_total: %v, want the agent's one series, not Envoy's", scrapes.GetMetric())
		}
		if split := fams["envoy_split_total"]; len(split.GetMetric()) != 1 || testkit.MetricSample(t, fams, "envoy_split_total", "part", "1") != 1 {
			t.Errorf("envoy_split_total: %d series, want its first part's one", len(split.GetMetric()))
		}
		if v := testkit.MetricSample(t, fams, "envoy_after_split"); v != 3 {
			t.Errorf("the family after the split = %v", v)
		}
		shared := fams["shared_total"]
		if shared.GetType() != dto.MetricType_COUNTER || len(shared.GetMetric()) != 3 || testkit.MetricSample(t, fams, "shared_total", "from", "both") != 2 {
			t.Errorf("shared_total: %v with %d series, want a counter of envoy, both (Envoy's 2), app:\n%s", shared.GetType(), len(shared.GetMetric()), body)
		}
		if n := len(fams["istio_requests_total"].GetMetric()); n != 100 {
			t.Errorf("istio_requests_total: %d series, want 100", n)
		}
	}
	for _, family := range []string{"family=istio_agent_scrapes_total", "family=envoy_split_total"} {
		if n := strings.Count(logs.String(), family); n != 1 {
			t.Errorf("%s logged %d times over 2 scrapes, want once:\n%s", family, n, logs.String())
		}
	}

	// A line that does not parse, in the second window: Envoy's part ends
	// before it, the rest of the answer comes, the failure is counted.
	bad := &exposition{contentType: "text/plain; version=0.0.4",
		body: []byte("# TYPE envoy_before gauge\nenvoy_before 1\n" + pad + "this is { not metrics\nenvoy_after 2\n")}
	base = serveMerged(t, bad, app)
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
