package status

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/meshagent/meshagent/services/status/metricsmerge"
)

// The merged scrape's cost: 5,000 Envoy series and 1,000 application
// series, through our status server, against fetching the two sources
// alone (what a scrape cannot do with less), and against Istio's agent
// doing the same merge (BenchmarkScrapeIstioAgent, when its binary is
// here). All over loopback HTTP with kept-alive connections, as Prometheus
// scrapes.
//
//	go test -run '^$' -bench 'Scrape|FetchSources' -benchmem ./services/status/

// envoyScale is an Envoy exposition of 5,000 series: 250 outbound clusters
// with 16 counters and 4 gauges each, grouped by family as Envoy renders.
func envoyScale() []byte {
	var sb strings.Builder
	families := []struct{ name, typ string }{
		{"envoy_cluster_upstream_cx_total", "counter"}, {"envoy_cluster_upstream_cx_connect_fail", "counter"},
		{"envoy_cluster_upstream_cx_destroy", "counter"}, {"envoy_cluster_upstream_cx_rx_bytes_total", "counter"},
		{"envoy_cluster_upstream_cx_tx_bytes_total", "counter"}, {"envoy_cluster_upstream_rq_total", "counter"},
		{"envoy_cluster_upstream_rq_completed", "counter"}, {"envoy_cluster_upstream_rq_timeout", "counter"},
		{"envoy_cluster_upstream_rq_retry", "counter"}, {"envoy_cluster_upstream_rq_pending_total", "counter"},
		{"envoy_cluster_upstream_rq_pending_overflow", "counter"}, {"envoy_cluster_upstream_rq_rx_reset", "counter"},
		{"envoy_cluster_upstream_rq_tx_reset", "counter"}, {"envoy_cluster_update_attempt", "counter"},
		{"envoy_cluster_update_success", "counter"}, {"envoy_cluster_assignment_stale", "counter"},
		{"envoy_cluster_upstream_cx_active", "gauge"}, {"envoy_cluster_upstream_rq_active", "gauge"},
		{"envoy_cluster_membership_healthy", "gauge"}, {"envoy_cluster_membership_total", "gauge"},
	}
	for _, f := range families {
		fmt.Fprintf(&sb, "# TYPE %s %s\n", f.name, f.typ)
		for c := range 250 {
			fmt.Fprintf(&sb, "%s{cluster_name=\"outbound|8080||svc-%03d.default.svc.cluster.local\"} %d\n", f.name, c, c*7)
		}
	}
	return []byte(sb.String())
}

// appScale is an application exposition of 1,000 series, as client_golang
// writes it: 10 families of 100 series with HELP and TYPE.
func appScale() []byte {
	var sb strings.Builder
	for f := range 10 {
		typ := "counter"
		name := fmt.Sprintf("shop_requests_%d_total", f)
		if f%2 == 1 {
			typ, name = "gauge", fmt.Sprintf("shop_inflight_%d", f)
		}
		fmt.Fprintf(&sb, "# HELP %s Requests of kind %d.\n# TYPE %s %s\n", name, f, name, typ)
		for s := range 100 {
			fmt.Fprintf(&sb, "%s{path=\"/api/v1/item/%d\",code=\"200\"} %d\n", name, s, s*3)
		}
	}
	return []byte(sb.String())
}

// scaleSources serves the two expositions and returns their ports. With
// shared, the application also exposes one of Envoy's families, so that
// the scrape must parse and merge every family instead of passing the
// bodies through.
func scaleSources(b *testing.B, shared bool) (envoyPort, appPort int) {
	b.Helper()
	envoy := httptest.NewServer(&exposition{contentType: "text/plain; version=0.0.4", body: envoyScale()})
	b.Cleanup(envoy.Close)
	appBody := appScale()
	if shared {
		appBody = append(appBody, "# TYPE envoy_cluster_upstream_cx_total counter\nenvoy_cluster_upstream_cx_total{cluster_name=\"app\"} 1\n"...)
	}
	app := httptest.NewServer(&exposition{contentType: "text/plain; version=0.0.4; charset=utf-8", body: appBody})
	b.Cleanup(app.Close)
	return portOf(b, envoy.URL), portOf(b, app.URL)
}

// benchClient keeps its connections, as Prometheus does between scrapes.
func benchClient(b *testing.B) *http.Client {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	b.Cleanup(c.CloseIdleConnections)
	return c
}

func fetch(b *testing.B, c *http.Client, url string) int {
	resp, err := c.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return int(n)
}

// benchScrapeURLIn runs a status server (see newFixtureIn) for a benchmark
// and returns its base URL (fixture.serve is for tests).
func benchScrapeURLIn(b *testing.B, cfg Config, in Inputs) string {
	f := newFixtureIn(cfg, in)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	f.svc.cfg.Addr = ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.svc.Serve(ctx) }()
	b.Cleanup(func() {
		cancel()
		<-done
	})
	base := "http://" + f.svc.cfg.Addr
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := client.Get(base + "/healthz/ready")
		if err == nil {
			resp.Body.Close()
			return base
		}
		if time.Now().After(deadline) {
			b.Fatal("status server did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkScrapeMerged is one scrape of our merged endpoint: the common
// case, sources passed through once checked.
func BenchmarkScrapeMerged(b *testing.B) { benchmarkScrape(b, false) }

// BenchmarkScrapeMergedFamilyByFamily is one scrape where a family is in
// two sources: every family parsed, merged and encoded again.
func BenchmarkScrapeMergedFamilyByFamily(b *testing.B) { benchmarkScrape(b, true) }

func benchmarkScrape(b *testing.B, shared bool) {
	envoyPort, appPort := scaleSources(b, shared)
	scrapeSources(b, envoyPort, appPort)
}

// scrapeSources times our merged scrape of the sources on envoyPort and
// appPort, with an empty agent registry.
func scrapeSources(b *testing.B, envoyPort, appPort int) {
	url := benchScrapeURLIn(b, mergedConfig(envoyPort, appPort), Inputs{Metrics: prometheus.NewRegistry()}) + "/stats/prometheus"
	c := benchClient(b)
	b.ReportAllocs()
	var size int
	for b.Loop() {
		size = fetch(b, c, url)
	}
	b.ReportMetric(float64(size), "bytes/scrape")
}

// prometheusScrape is how Prometheus 3 asks (its default scrape_protocols
// and compression), as bench/vs-istio's idle window scrapes.
var prometheusScrape = http.Header{
	"Accept": {"application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4," +
		"text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"},
	"Accept-Encoding":                     {"gzip"},
	"X-Prometheus-Scrape-Timeout-Seconds": {"10"},
	"User-Agent":                          {"Prometheus/3.5.0"},
}

// BenchmarkScrapeIdleAgent is the idle agent's scrape (#36): the agent's
// registry with the Go and process collectors (as cmd registers them) and
// the stand-in Envoy's exposition, asked as Prometheus 3 asks, gzip
// included; B/op is the whole process's, the server's share most of it.
func BenchmarkScrapeIdleAgent(b *testing.B) { benchmarkIdleScrape(b, false) }

// BenchmarkScrapeIdleAgentAfterGC is the same scrape after two GCs, which
// empty every sync.Pool: at idle a scrape every 15 s and a GC every 30-75 s
// leave one scrape in several to find the pools empty (#36).
func BenchmarkScrapeIdleAgentAfterGC(b *testing.B) { benchmarkIdleScrape(b, true) }

func benchmarkIdleScrape(b *testing.B, afterGC bool) {
	envoy := httptest.NewServer(&exposition{contentType: "text/plain; version=0.0.4", body: envoyExposition(b)})
	b.Cleanup(envoy.Close)
	reg := agentRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	url := benchScrapeURLIn(b, Config{Metrics: metricsmerge.Config{EnvoyPort: portOf(b, envoy.URL)}}, Inputs{Metrics: reg}) + "/stats/prometheus"
	c := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	b.Cleanup(c.CloseIdleConnections)
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header = prometheusScrape
	b.ReportAllocs()
	var size int64
	for b.Loop() {
		if afterGC {
			b.StopTimer()
			runtime.GC()
			runtime.GC()
			b.StartTimer()
		}
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		size, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "gzip" {
			b.Fatalf("answer %d, Content-Encoding %q", resp.StatusCode, resp.Header.Get("Content-Encoding"))
		}
	}
	b.ReportMetric(float64(size), "gzbytes/scrape")
}

// BenchmarkFetchSourcesSeparately is the floor: Envoy's and the
// application's expositions fetched one after the other, nothing merged.
func BenchmarkFetchSourcesSeparately(b *testing.B) {
	envoyPort, appPort := scaleSources(b, false)
	fetchSources(b, envoyPort, appPort)
}

// fetchSources times fetching the sources on envoyPort and appPort one
// after the other.
func fetchSources(b *testing.B, envoyPort, appPort int) {
	c := benchClient(b)
	b.ReportAllocs()
	var size int
	for b.Loop() {
		size = fetch(b, c, "http://localhost:"+strconv.Itoa(envoyPort)+"/stats/prometheus") +
			fetch(b, c, "http://localhost:"+strconv.Itoa(appPort)+"/metrics")
	}
	b.ReportMetric(float64(size), "bytes/scrape")
}

// BenchmarkScrapeIstioAgent is one scrape of Istio's agent merging the same
// sources: its Envoy is a stand-in that only sleeps (Istio skips Envoy's
// metrics with DISABLE_ENVOY), ENVOY_PROMETHEUS_PORT points at the Envoy
// exposition, ISTIO_PROMETHEUS_ANNOTATIONS at the application's. Its own
// allocations are read from its go_memstats counters.
func BenchmarkScrapeIstioAgent(b *testing.B) {
	binary, why := istioAgentBinary()
	if binary == "" {
		b.Skip(why)
	}
	envoyPort, appPort := scaleSources(b, false)
	// The stub ignores its bootstrap, so the template can be empty.
	dir := b.TempDir()
	stub, template := filepath.Join(dir, "envoy"), filepath.Join(dir, "bootstrap.tmpl.json")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\nexec sleep 3600\n"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(template, []byte("{}\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	istio := startIstioAgent(b, binary,
		fmt.Sprintf(`,"binaryPath":%q,"proxyBootstrapTemplatePath":%q,"drainDuration":"1s","terminationDrainDuration":"0s"`, stub, template),
		"DISABLE_ENVOY=false",
		"ENVOY_PROMETHEUS_PORT="+strconv.Itoa(envoyPort),
		fmt.Sprintf(`ISTIO_PROMETHEUS_ANNOTATIONS={"scrape":"true","port":"%d","path":"/metrics"}`, appPort))
	url := istio.statusURL + "/stats/prometheus"
	c := benchClient(b)
	before := istioAllocs(b, c, url)
	b.ReportAllocs()
	var size, scrapes int
	for b.Loop() {
		size = fetch(b, c, url)
		scrapes++
	}
	b.StopTimer()
	after := istioAllocs(b, c, url)
	b.ReportMetric(float64(size), "bytes/scrape")
	b.ReportMetric((after.mallocs-before.mallocs)/float64(scrapes+1), "istio-allocs/op")
	b.ReportMetric((after.bytes-before.bytes)/float64(scrapes+1), "istio-B/op")
}

type allocCount struct{ mallocs, bytes float64 }

// istioAllocs reads Istio's agent's own allocation counters (a scrape
// itself, counted in the division above).
func istioAllocs(b *testing.B, c *http.Client, url string) allocCount {
	resp, err := c.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got allocCount
	for line := range strings.Lines(string(body)) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		v, _ := strconv.ParseFloat(value, 64)
		switch name {
		case "istio_agent_go_memstats_mallocs_total":
			got.mallocs = v
		case "istio_agent_go_memstats_alloc_bytes_total":
			got.bytes = v
		}
	}
	if got.mallocs == 0 {
		b.Fatal("Istio's agent reports no istio_agent_go_memstats_mallocs_total")
	}
	return got
}

// BenchmarkScrapeLargeApplication is a scrape whose application exposes
// 2 MB (a JVM service's request histogram, #36): streamed past the 64 KiB
// held, each window checked. BenchmarkFetchLargeApplication is what
// copying the same sources costs, as Istio's agent does.
func BenchmarkScrapeLargeApplication(b *testing.B) {
	envoyPort, appPort := largeAppSources(b)
	scrapeSources(b, envoyPort, appPort)
}

func BenchmarkFetchLargeApplication(b *testing.B) {
	envoyPort, appPort := largeAppSources(b)
	fetchSources(b, envoyPort, appPort)
}

func largeAppSources(b *testing.B) (envoyPort, appPort int) {
	envoy := httptest.NewServer(&exposition{contentType: "text/plain; version=0.0.4", body: envoyExposition(b)})
	b.Cleanup(envoy.Close)
	app := httptest.NewServer(&exposition{contentType: "text/plain; version=0.0.4; charset=utf-8",
		body: []byte(requestLines("http_server_requests_total", 0, 2000))})
	b.Cleanup(app.Close)
	return portOf(b, envoy.URL), portOf(b, app.URL)
}
