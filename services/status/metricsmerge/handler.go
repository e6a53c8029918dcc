package metricsmerge

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/munnerz/goautoneg"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/messages"
)

// agentMetricsPrefix is put before every family of the agent's registry,
// as Istio's agent registers its own metrics, Go and process collectors
// included (initializeMonitoring: WrapRegistererWithPrefix("istio_agent_")),
// so dashboards built for Istio find them.
const agentMetricsPrefix = "istio_agent_"

// defaultScrapeTimeout bounds a scrape whose caller sent no
// X-Prometheus-Scrape-Timeout-Seconds (Prometheus' default scrape_timeout).
const defaultScrapeTimeout = 10 * time.Second

// Failure kinds, the type label of scrape_failures_total (Istio's names).
const (
	failureEnvoy = "envoy"
	failureApp   = "application"
	failureAgent = "agent"
)

// Handler serves /stats/prometheus and /metrics: the agent's
// registry, then Envoy's exposition, then the application's, as one
// exposition in the format the caller asked for: clean text sources as
// they came (Envoy's streamed, stream.go), the rest parsed and encoded again.
// Sources are fetched concurrently within the scrape's timeout; a source
// that fails is left out and counted, never failing the scrape (Istio's
// rule: the application may be down, Envoy's metrics still matter).
type Handler struct {
	cfg    Config
	agent  prometheus.Gatherer
	client *http.Client
	log    *slog.Logger

	scrapes  prometheus.Counter
	failures *prometheus.CounterVec

	buffers sync.Pool // *bytes.Buffer: source bodies and the answer
	windows sync.Pool // *[]byte of streamWindow: a body streamed (stream.go)
	// sizes are the last lengths of the answer and of each source's body
	// (answerSize, envoySize, appSize), for buffer.
	sizes []atomic.Int64
	// lastAccept is the last Accept header negotiated (acceptOf).
	lastAccept atomic.Pointer[acceptance]
	// prefixedNames are the agent's family names under Istio's prefix
	// (string to *string), made once rather than on every scrape (#36).
	prefixedNames sync.Map
	// conflicts are the family names already logged as refused, so a
	// conflict is logged once rather than on every scrape.
	conflicts sync.Map
}

// New returns the merged endpoint serving the agent's registry agent and
// cfg's sources; it makes its own metrics (scrapes_total,
// scrape_failures_total, Istio's names) with mm, for the agent registry.
func New(cfg Config, agent prometheus.Gatherer, log *slog.Logger, mm *messages.Metrics) *Handler {
	if cfg.BodyLimit <= 0 {
		cfg.BodyLimit = defaultMetricsBodyLimit
	}
	m := &Handler{
		cfg:   cfg,
		agent: agent,
		// Sources are on localhost: no proxy from the environment, and
		// connections kept between scrapes (Serve closes them).
		client:   &http.Client{Transport: &http.Transport{Proxy: nil, IdleConnTimeout: time.Minute}},
		log:      log,
		scrapes:  mm.Counter("scrapes_total", "The total number of scrapes."),
		failures: mm.CounterVec("scrape_failures_total", "The total number of failed scrapes.", "type"),
	}
	m.sizes = make([]atomic.Int64, appSize(len(cfg.App)))
	for _, kind := range []string{failureEnvoy, failureApp, failureAgent} {
		m.failures.WithLabelValues(kind)
	}
	return m
}

// CloseIdleConnections ends the connections kept to the sources between
// scrapes, once the server serving m has stopped.
func (m *Handler) CloseIdleConnections() { m.client.CloseIdleConnections() }

// ServeHTTP answers one scrape.
func (m *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.scrapes.Inc()
	budget := scrapeBudget(r.Header)
	ctx, cancel := context.WithTimeout(r.Context(), budget)
	defer cancel()

	sources := m.sources(r)
	results := make([]sourceResult, len(sources))
	// Envoy's answer is read once the answer's format is known: streamed
	// into it when that is text (stream.go), else read as the others.
	var envoy *http.Response
	var wg sync.WaitGroup
	for i, src := range sources {
		if src.kind == failureEnvoy {
			wg.Go(func() {
				var err error
				if envoy, err = m.fetch(ctx, src, r.Header.Get("User-Agent"), budget); err != nil {
					results[i] = sourceResult{err: err}
				}
			})
			continue
		}
		wg.Go(func() { results[i] = m.scrape(ctx, src, r.Header.Get("User-Agent"), budget) })
	}
	gathered, err := m.agent.Gather()
	if err != nil {
		// Gather returns what it could gather beside the error.
		m.failed(failureAgent, err)
	}
	agent := m.prefixed(gathered)
	wg.Wait()
	defer func() {
		for _, res := range results {
			if res.raw != nil {
				m.buffers.Put(res.raw)
			}
			if res.rest != nil {
				res.rest.Close()
			}
		}
	}()
	// Envoy, when asked, is sources[0], and was asked for text.
	format := m.negotiate(r.Header, results)
	var origins map[string]bool
	if envoy != nil {
		var clean bool
		origins, clean = familyOrigins(agent, results[1:])
		if isOpenMetrics(envoy.Header.Get("Content-Type")) || format.FormatType() != expfmt.TypeTextPlain || !clean {
			results[0], envoy = m.read(envoy, sources[0]), nil
			format = m.negotiate(r.Header, results)
		}
	}
	text := format.FormatType() == expfmt.TypeTextPlain
	for i, res := range results {
		if res.rest != nil && !text {
			results[i] = m.finish(res, sources[i])
		}
	}
	for i, res := range results {
		if res.err != nil {
			m.failed(sources[i].kind, res.err)
		}
	}
	if envoy != nil {
		m.streamEnvoy(w, envoy, format, agent, origins, sources, results)
		return
	}

	out := m.buffer(&m.sizes[answerSize])
	defer m.buffers.Put(out)
	var written map[string]bool // the answer's families, for streamApps
	clean := false
	if text {
		written, clean = familyOrigins(agent, results)
	}
	if clean {
		// The common case: the text answer is the agent's families and
		// the sources' bodies as they came, as Istio's is, after checking
		// that this makes one valid exposition.
		m.encode(out, format, agent)
		writeBodies(out, results)
	} else {
		merged := m.merge(agent, sources, results)
		m.encode(out, format, merged)
		if streamed(results) {
			written = make(map[string]bool, len(merged))
			for _, f := range merged {
				written[f.GetName()] = false
			}
		}
	}
	m.sizes[answerSize].Store(int64(out.Len()))
	m.send(w, format, out.Bytes())
	m.streamApps(&answerWriter{w: w}, written, sources, results)
}

// writeBodies writes the sources' bodies that pass through as they came,
// each ending its last line (not those streamed after, streamApps).
func writeBodies(w io.Writer, results []sourceResult) {
	for _, res := range results {
		if res.raw != nil && res.rest == nil {
			w.Write(res.raw.Bytes())
			if !bytes.HasSuffix(res.raw.Bytes(), []byte("\n")) {
				w.Write([]byte("\n"))
			}
		}
	}
}

// negotiate is the answer's format: OpenMetrics when the caller prefers it
// and a source answered OpenMetrics, else text, as Istio's agent answers
// whatever the Accept (its format is the application's). Text sources
// carry nothing OpenMetrics would add, and Prometheus prefers OpenMetrics
// but accepts text: re-encoding them as OpenMetrics parsed every line of
// Envoy's exposition on every scrape, 1.5-1.7x the CPU of passing it through
// (#36). A caller that does not accept text gets OpenMetrics, as before.
func (m *Handler) negotiate(h http.Header, results []sourceResult) expfmt.Format {
	a := m.acceptOf(h)
	if a.preferred.FormatType() != expfmt.TypeOpenMetrics || !a.takesText {
		return a.preferred
	}
	for _, res := range results {
		if res.err == nil && res.openMetrics {
			return a.preferred
		}
	}
	return a.text
}

// acceptance is what one Accept header allows, for negotiate.
type acceptance struct {
	header    string
	preferred expfmt.Format // OpenMetrics or text, as the caller prefers
	text      expfmt.Format // the text format the caller takes
	takesText bool
}

// acceptOf works out what h's Accept allows, once per distinct header:
// Prometheus sends the same one on every scrape, and negotiating it afresh
// parsed it three times, 4.5 kB of garbage a scrape (#36).
func (m *Handler) acceptOf(h http.Header) *acceptance {
	header := h.Get("Accept")
	if a := m.lastAccept.Load(); a != nil && a.header == header {
		return a
	}
	a := &acceptance{
		header:    header,
		preferred: expfmt.NegotiateAccept(h, expfmt.FmtOpenMetrics_1_0_0, expfmt.FmtOpenMetrics_0_0_1, expfmt.FmtText),
		text:      expfmt.NegotiateAccept(h, expfmt.FmtText),
		takesText: goautoneg.Negotiate(header, []string{"text/plain"}) != "",
	}
	m.lastAccept.Store(a)
	return a
}

// familyOrigins are the names of the agent's families (false) and of the
// sources' (true), those streamed after the rest (streamApps) aside: their
// families are not known before. ok is whether the sources can be written
// as they came: each scanned clean, and no family is in two places.
func familyOrigins(agent []*dto.MetricFamily, results []sourceResult) (origins map[string]bool, ok bool) {
	// Sized to what is there: a fixed 1024 more made 51 kB of garbage a
	// scrape, most of what brings the idle agent's heap to its GC goal
	// (#36).
	n := len(agent)
	for _, res := range results {
		n += len(res.names)
	}
	origins = make(map[string]bool, n)
	for _, f := range agent {
		origins[f.GetName()] = false
	}
	for _, res := range results {
		if res.err != nil || res.rest != nil {
			continue
		}
		if res.raw == nil {
			return origins, false
		}
		for _, n := range res.names {
			if _, dup := origins[n]; dup {
				return origins, false
			}
			origins[n] = true
		}
	}
	return origins, true
}

// merge parses what is still raw and merges every family by name (see
// familySet).
func (m *Handler) merge(agent []*dto.MetricFamily, sources []source, results []sourceResult) []*dto.MetricFamily {
	set := newFamilySet(len(agent) + 1024)
	set.add(agent)
	for i, res := range results {
		if res.err != nil || res.rest != nil {
			continue
		}
		fams := res.families
		if res.raw != nil {
			var err error
			if fams, err = parseExposition(res.raw.Bytes(), "text/plain"); err != nil {
				m.failed(sources[i].kind, err) // scanned, so not expected
				continue
			}
		}
		for _, name := range set.add(fams) {
			if _, logged := m.conflicts.LoadOrStore(name, true); !logged {
				m.log.Warn("metric family left out of the merged metrics: another source has it with another type",
					"family", name, "source", sources[i].kind)
			}
		}
	}
	return set.families()
}

// encode writes the families in the format the caller accepts (text 0.0.4,
// or OpenMetrics when asked), leaving out whole any family the encoder
// refuses.
func (m *Handler) encode(buf *bytes.Buffer, format expfmt.Format, fams []*dto.MetricFamily) {
	enc := expfmt.NewEncoder(buf, format)
	for _, f := range fams {
		mark := buf.Len()
		if err := enc.Encode(f); err != nil {
			buf.Truncate(mark)
			m.log.Debug("metric family left out: cannot be encoded", "family", f.GetName(), "error", err)
		}
	}
	if c, ok := enc.(expfmt.Closer); ok {
		_ = c.Close() // OpenMetrics' "# EOF"
	}
}

// send answers with body. Compression is the status server's, for every
// answer (#35).
func (m *Handler) send(w http.ResponseWriter, format expfmt.Format, body []byte) {
	w.Header().Set("Content-Type", string(format))
	_, _ = w.Write(body)
}

// buffer is a pooled buffer, or a new one made at the length its use last
// needed (size): at idle the GC empties the pool between scrapes, and
// growing a new buffer by doubling to a 45 kB answer made twice that in
// garbage (#36). MinRead more, for ReadFrom grows a buffer without it.
func (m *Handler) buffer(size *atomic.Int64) *bytes.Buffer {
	if b, ok := m.buffers.Get().(*bytes.Buffer); ok {
		b.Reset()
		return b
	}
	return bytes.NewBuffer(make([]byte, 0, size.Load()+bytes.MinRead))
}

// prefixed renames the agent's families with Istio's prefix. The families
// are copied, not changed: a Gatherer may hand out shared ones. The copies
// are one allocation and share their names between scrapes (#36: one
// allocation a family and its name made 9 kB of garbage a scrape).
func (m *Handler) prefixed(fams []*dto.MetricFamily) []*dto.MetricFamily {
	copies := make([]dto.MetricFamily, len(fams))
	out := make([]*dto.MetricFamily, len(fams))
	for i, f := range fams {
		c := &copies[i]
		c.Name, c.Help, c.Type, c.Unit, c.Metric = m.prefixedName(f.GetName()), f.Help, f.Type, f.Unit, f.Metric
		out[i] = c
	}
	return out
}

// prefixedName is name under Istio's prefix. Nothing changes a family's
// name once made, so one string serves every scrape.
func (m *Handler) prefixedName(name string) *string {
	if p, ok := m.prefixedNames.Load(name); ok {
		return p.(*string)
	}
	p, _ := m.prefixedNames.LoadOrStore(name, proto.String(agentMetricsPrefix+name))
	return p.(*string)
}
