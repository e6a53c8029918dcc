package metricsmerge

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// The sources of a scrape, Envoy's endpoint and the application's: how each
// is asked, read and parsed, within the scrape's budget.

// source is one endpoint a scrape merges.
type source struct {
	kind   string // failureEnvoy or failureApp
	url    string
	accept string
	size   *atomic.Int64 // its body's last length (Handler.sizes)
}

// The uses of Handler.sizes: the answer's, Envoy's body's, then each
// application endpoint's (appSize).
const (
	answerSize = 0
	envoySize  = 1
)

func appSize(i int) int { return 2 + i }

// sourceResult is what a source answered, or why it is left out.
type sourceResult struct {
	// raw is a text body that scanned clean; names are its families.
	raw   *bytes.Buffer
	names []string
	// families is the parsed body, for OpenMetrics or a body that is not
	// clean (or, later, when another source has one of its families).
	families []*dto.MetricFamily
	// openMetrics: the source answered OpenMetrics (see negotiate).
	openMetrics bool
	// rest is the unread rest of an application's text answer longer than
	// heldLimit; raw holds what was read of it. Both are streamed after
	// the rest of a text answer (streamApps), not merged, or read to the
	// end for another format (finish).
	rest io.ReadCloser
	err  error
}

// sources are Envoy's endpoint (with the caller's query, as Istio passes
// ?usedonly or ?filter= on) and the application's.
func (m *Handler) sources(r *http.Request) []source {
	var out []source
	if m.cfg.EnvoyPort > 0 {
		url := "http://localhost:" + strconv.Itoa(m.cfg.EnvoyPort) + "/stats/prometheus"
		if r.URL.RawQuery != "" {
			url += "?" + r.URL.RawQuery
		}
		out = append(out, source{kind: failureEnvoy, url: url, accept: "text/plain;version=0.0.4", size: &m.sizes[envoySize]})
	}
	for i, t := range m.cfg.App {
		out = append(out, source{
			size: &m.sizes[appSize(i)],
			kind: failureApp,
			url:  "http://localhost:" + strconv.Itoa(t.Port) + t.Path,
			// Either is parsed; text first, as it is the format every
			// client library serves.
			accept: "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5",
		})
	}
	return out
}

// scrape fetches and parses one source.
func (m *Handler) scrape(ctx context.Context, src source, userAgent string, budget time.Duration) sourceResult {
	resp, err := m.fetch(ctx, src, userAgent, budget)
	if err != nil {
		return sourceResult{err: err}
	}
	return m.read(resp, src)
}

// fetch asks one source, up to its answer's header.
func (m *Handler) fetch(ctx context.Context, src source, userAgent string, budget time.Duration) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, src.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", src.accept)
	// The source gets the time this scrape gives it, as Prometheus tells
	// its targets.
	req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", strconv.FormatFloat(budget.Seconds(), 'f', 3, 64))
	if userAgent != "" {
		req.Header.Set("User-Agent", userAgent)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, &sourceError{url: src.url, msg: "status " + resp.Status}
	}
	return resp, nil
}

// read reads and parses a source's answer. An application's text answer
// is read up to heldLimit, and past it left to be streamed (rest).
func (m *Handler) read(resp *http.Response, src source) sourceResult {
	body := http.MaxBytesReader(nil, resp.Body, m.cfg.BodyLimit)
	ct := resp.Header.Get("Content-Type")
	streamable := src.kind == failureApp && !isOpenMetrics(ct)
	var r io.Reader = body
	if streamable {
		r = io.LimitReader(body, heldLimit+1)
	}
	buf := m.buffer(src.size)
	if _, err := buf.ReadFrom(r); err != nil {
		body.Close()
		m.buffers.Put(buf)
		return sourceResult{err: &sourceError{url: src.url, msg: "reading the answer", err: err}}
	}
	src.size.Store(int64(buf.Len()))
	if streamable && buf.Len() > heldLimit {
		return sourceResult{raw: buf, rest: body}
	}
	body.Close()
	return m.parse(buf, ct, src)
}

// finish reads the rest of an answer read in part (sourceResult.rest), for
// an answer that is not text and so cannot stream it.
func (m *Handler) finish(res sourceResult, src source) sourceResult {
	defer res.rest.Close()
	if _, err := res.raw.ReadFrom(res.rest); err != nil {
		m.buffers.Put(res.raw)
		return sourceResult{err: &sourceError{url: src.url, msg: "reading the answer", err: err}}
	}
	src.size.Store(int64(res.raw.Len()))
	return m.parse(res.raw, "text/plain", src)
}

// parse parses a source's body buf of content type ct: a clean text body
// is kept as it came (raw), anything else parsed into families.
func (m *Handler) parse(buf *bytes.Buffer, ct string, src source) sourceResult {
	if isOpenMetrics(ct) {
		defer m.buffers.Put(buf)
		fams, err := parseExposition(buf.Bytes(), ct)
		if err != nil {
			return sourceResult{err: &sourceError{url: src.url, msg: "parsing the answer", err: err}}
		}
		return sourceResult{families: fams, openMetrics: true}
	}
	names, clean, err := scanExposition(buf.Bytes())
	if err != nil {
		m.buffers.Put(buf)
		return sourceResult{err: &sourceError{url: src.url, msg: "parsing the answer", err: err}}
	}
	if !clean {
		defer m.buffers.Put(buf)
		fams, err := parseExposition(buf.Bytes(), "text/plain")
		if err != nil {
			return sourceResult{err: &sourceError{url: src.url, msg: "parsing the answer", err: err}}
		}
		return sourceResult{families: fams}
	}
	return sourceResult{raw: buf, names: names}
}

type sourceError struct {
	url, msg string
	err      error
}

func (e *sourceError) Error() string {
	if e.err == nil {
		return e.url + ": " + e.msg
	}
	return e.url + ": " + e.msg + ": " + e.err.Error()
}

func (e *sourceError) Unwrap() error { return e.err }

func (m *Handler) failed(kind string, err error) {
	m.failures.WithLabelValues(kind).Inc()
	m.log.Warn("metrics source failed; merged metrics go on without it", "type", kind, "error", err)
}

// scrapeBudget is how long the sources may take: the caller's
// X-Prometheus-Scrape-Timeout-Seconds less a tenth, left to merge and
// answer before the caller gives up.
func scrapeBudget(h http.Header) time.Duration {
	timeout := defaultScrapeTimeout
	if v := h.Get("X-Prometheus-Scrape-Timeout-Seconds"); v != "" {
		if secs, err := strconv.ParseFloat(v, 64); err == nil && secs > 0 {
			timeout = time.Duration(secs * float64(time.Second))
		}
	}
	return timeout - timeout/10
}
