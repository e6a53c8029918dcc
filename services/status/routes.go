package status

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/klauspost/compress/gzhttp"
	"github.com/klauspost/compress/gzip"

	"github.com/meshagent/meshagent/messages"
)

// route is one endpoint of the status server: registered and listed on
// GET / from the same table, so the index cannot drift from what is served
// (issue 22).
type route struct {
	pattern string // a ServeMux pattern: "GET /path" or "/path" (any method)
	handler http.HandlerFunc
	// loopback: only callers on loopback are answered (403 otherwise).
	loopback bool
	// istio: Istio's agent serves it too; else it is meshagent's own.
	istio bool
	doc   string
}

// path is the route as GET / shows it: its pattern without the ServeMux's
// end-of-path marker ("GET /debug/{$}" is "GET /debug/").
func (r route) path() string { return strings.TrimSuffix(r.pattern, "{$}") }

// routeTable lists every endpoint this server answers, in the order GET /
// shows them.
func (s *Service) routeTable() []route {
	metricsLocal := s.cfg.Metrics.LocalhostOnly
	rs := []route{
		{"GET /healthz/ready", s.handleReady, false, true, "readiness: 200, or 503 naming every reason (kubelet, via Envoy's 15021)"},
		// Any method, as Istio: kubelet's GET and lifecycle hooks.
		{"/app-health/", s.prober.ServeHTTP, false, true, "the application's rewritten probes: /app-health/<container>/{livez,readyz,startupz}"},
		{"/app-lifecycle/", s.prober.ServeHTTP, false, true, "the application's lifecycle hooks: /app-lifecycle/<container>/{prestopz,poststartz}"},
		{"GET /stats/prometheus", s.metrics.ServeHTTP, metricsLocal, true, "the agent's, Envoy's and the application's metrics, merged"},
		{"GET /metrics", s.metrics.ServeHTTP, metricsLocal, true, "the same as /stats/prometheus"},
		{"/quitquitquit", postOnly(s.handleQuit), true, true, "POST: stop now, without draining"},
		{"/drain", postOnly(s.handleDrain), true, true, "POST: drain Envoy's listeners and keep running (the preStop hook)"},
		// The tree names every service, its last error and the control
		// plane's address: loopback only, as pprof and /debug/ndsz (issue
		// 12; kubectl port-forward arrives on loopback).
		{"GET /debug/tree", s.handleTree, true, false, "the supervision tree: each service's state, restarts and last error; ?format=json"},
		{"GET /debug/{$}", s.handlePage, true, false, "the status page (HTML, refreshes itself): the tree, the xDS verdicts, the certificate, the DNS table"},
	}
	if s.in.XDS != nil {
		rs = append(rs, route{"GET /debug/xds", s.handleXDS, true, false,
			"per xDS type: what was sent, ACKed or NACKed (with Envoy's error) and the verdict (meshagent proxy-status)"})
	}
	if s.in.Certs != nil {
		rs = append(rs, route{"GET /debug/certs", s.handleCerts, true, false,
			"the workload certificate: SANs, serial, validity, time left, the roots' SHA-256 fingerprints"})
	}
	if s.in.Names != nil {
		rs = append(rs, route{"GET /debug/names", s.handleNames, true, false,
			"the DNS name table: version, number of names, source (NDS or file); the names are on /debug/ndsz"})
	}
	if s.cfg.Chaos {
		rs = append(rs, route{"/debug/chaos/kill", postOnly(s.handleChaosKill), true, false, "POST ?service=NAME[&for=DUR]: make a service fail (--chaos)"})
	}
	for _, path := range slices.Sorted(maps.Keys(s.in.Debug)) {
		page := s.in.Debug[path]
		rs = append(rs, route{"GET " + path, page.Handler.ServeHTTP, true, false, page.Doc})
	}
	if s.cfg.Profiling {
		rs = append(rs,
			route{"/debug/pprof/", pprof.Index, true, true, "Go's profiles (--profiling)"},
			route{"/debug/pprof/cmdline", pprof.Cmdline, true, true, ""},
			route{"/debug/pprof/profile", pprof.Profile, true, true, ""},
			route{"/debug/pprof/symbol", pprof.Symbol, true, true, ""},
			route{"/debug/pprof/trace", pprof.Trace, true, true, ""},
		)
	}
	return rs
}

func (s *Service) routes() http.Handler {
	mux := http.NewServeMux()
	table := s.routeTable()
	for _, r := range table {
		h := s.limits.wrap(r.pattern, r.handler)
		if r.loopback {
			h = loopbackOnly(h)
		}
		mux.HandleFunc(r.pattern, h)
	}
	mux.HandleFunc("GET /{$}", indexHandler(table))
	return compressed(mux)
}

// compressed is Istio's status server's compression (#35): every answer,
// whatever its endpoint, through klauspost/compress's gzhttp
// (pilot/cmd/pilot-agent/status/server.go serves gzhttp.GzipHandler(mux)):
// zstd or gzip by Accept-Encoding, zstd when both are accepted with the
// same q, nothing below 1 KiB or for a HEAD, and "Vary: Accept-Encoding"
// on every answer. One setting differs from Istio's defaults: gzip is
// klauspost's stateless level, for Prometheus asks for gzip on every scrape
// and the scrape's CPU and garbage are the agent's (#36). gzhttp keeps a
// level's writer (BestSpeed's 0.8 MB, its default level 5's 1.1 MB) in a
// sync.Pool that the GC empties between idle scrapes: a scrape that found
// it empty made 0.8 MB of garbage and spent ~150 µs building it, and a full
// pool held 0.8 MB live through a GC. The stateless level keeps nothing
// between answers (its block buffer is pooled, 0.26 MB when cold) and costs
// about a warm BestSpeed writer's CPU; the merged answer is ~5 % larger
// (gzhttp compresses its first KiB apart, and stateless blocks do not look
// back). zstd keeps gzhttp's (and Istio's) fastest.
func compressed(h http.Handler) http.Handler {
	wrap, err := gzhttp.NewWrapper(gzhttp.CompressionLevel(gzip.StatelessCompression))
	if err != nil {
		panic(fmt.Sprintf("gzhttp refused the stateless gzip level: %v", err)) // a valid level: cannot happen
	}
	return wrap(h)
}

// indexHandler answers GET / with one line per endpoint: what it is, whose
// it is (Istio's or ours) and who may call it. Istio's agent answers 404.
func indexHandler(table []route) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "meshagent status server: the endpoints it answers")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ENDPOINT\tOF\tWHO MAY CALL\tWHAT")
		for _, r := range table {
			if r.doc == "" {
				continue
			}
			of, who := "meshagent", "anyone"
			if r.istio {
				of = "istio"
			}
			if r.loopback {
				who = "loopback only"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.path(), of, who, r.doc)
		}
		tw.Flush()
	}
}

// handleXDS serves the XDS proxy's report as JSON: the "xds" object of
// /debug/tree?format=json, which `meshagent proxy-status` reads.
func (s *Service) handleXDS(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.xdsReport().json())
}

// handleReady answers kubelet (through Envoy's 15021) and `meshagent wait`:
// 200 when every required service and Envoy are ready, else 503 with every
// reason in plain text.
func (s *Service) handleReady(w http.ResponseWriter, _ *http.Request) {
	v := s.view.Load()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !v.ready {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: %s\n", v.reason)
		return
	}
	fmt.Fprintln(w, "ready")
}

// handleTree prints the supervision tree: each node's state, restarts,
// panics and last error, then the XDS proxy's upstream; JSON with
// ?format=json.
func (s *Service) handleTree(w http.ResponseWriter, r *http.Request) {
	t, _ := s.in.Tree.Get()
	v := s.view.Load()
	xds := s.xdsReport()
	if r.URL.Query().Get("format") == "json" {
		services := make([]serviceJSON, len(t.Services))
		for i, n := range t.Services {
			n.StateName = displayState(n, v)
			services[i] = serviceJSON{ServiceInfo: n, HealthReason: v.healths[n.Name].Reason}
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(struct {
			Ready    bool          `json:"ready"`
			Reason   string        `json:"reason,omitempty"`
			Services []serviceJSON `json:"services"`
			XDS      *XDSReport    `json:"xds,omitempty"`
		}{v.ready, v.reason, services, xds.json()})
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	writeTree(w, t, v)
	writeXDS(w, xds)
}

// serviceJSON is a service in /debug/tree?format=json: the tree's view of
// it and, whole, what the service last said of itself (its Health reason),
// which the text view shows in its REASON column (#21: the JSON had lost it).
type serviceJSON struct {
	messages.ServiceInfo
	HealthReason string `json:"health_reason,omitempty"`
}

func writeTree(w io.Writer, t messages.TreeState, v *view) {
	readiness := "ready"
	if !v.ready {
		readiness = "not ready: " + v.reason
	}
	fmt.Fprintf(w, "meshagent (%s)\n", readiness)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tSTATE\tRESTARTS\tPANICS\tSINCE\tREASON / LAST ERROR")
	for _, n := range t.Services {
		depth := strings.Count(n.Path, "/")
		label := strings.Repeat("  ", depth) + "├── " + n.Name
		state := displayState(n, v)
		if n.State == messages.Failed && n.NextDelay > 0 {
			state += " (retry in " + n.NextDelay.Round(time.Millisecond).String() + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", label, state, n.Restarts, n.Panics,
			n.Since.UTC().Format(time.RFC3339), oneLine(serviceNote(n, v)))
	}
	tw.Flush()
}

// serviceNote is a node's REASON / LAST ERROR: what the service says of
// itself now, then the tree's last error. Both: a note of a ready service
// (who answers the kubelet's probe, a refused hot restart) must not hide
// why it was restarted (#36).
func serviceNote(n messages.ServiceInfo, v *view) string {
	h, ok := v.healths[n.Name]
	switch {
	case !ok || h.Reason == "" || h.State == messages.Failed:
		return n.LastError
	case n.LastError != "":
		return h.Reason + "; last error: " + n.LastError
	}
	return h.Reason
}

// displayState is a node's state for people: the tree knows whether a
// service runs, the service's own Health knows whether it is ready.
func displayState(n messages.ServiceInfo, v *view) string {
	if n.Kind == "supervisor" && n.State == messages.Starting {
		return "running" // a supervisor has no readiness of its own
	}
	if h, ok := v.healths[n.Name]; ok && n.State == messages.Stopped && n.Reason == "done" {
		return h.State.String() + ", done" // a one-shot keeps its verdict
	}
	if h, ok := v.healths[n.Name]; ok && n.State == messages.Starting {
		return h.State.String()
	}
	return n.StateName
}

// The REASON column of the text tree shows a long reason's start (what
// failed, as before) and its end (the underlying error, which Go's wrapping
// puts last: "...: connection refused"), cut in the middle; the JSON view
// has it whole (#21).
const (
	reasonHead = 200
	reasonTail = 100
)

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) <= reasonHead+reasonTail {
		return s
	}
	return s[:runeStart(s, reasonHead)] + " … " + s[runeStart(s, len(s)-reasonTail):]
}

// runeStart is i, moved back to the start of the rune it falls in.
func runeStart(s string, i int) int {
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return i
}

// handleQuit is Istio's /quitquitquit: stop the agent now, without
// draining.
func (s *Service) handleQuit(w http.ResponseWriter, _ *http.Request) {
	s.log.Info("quit requested over /quitquitquit")
	s.out.Shutdown.Send(messages.Shutdown{Reason: "/quitquitquit", Graceful: false})
	fmt.Fprintln(w, "OK")
}

// handleDrain is Istio's /drain: drain Envoy's listeners and keep running
// (the native-sidecar preStop hook); a later SIGTERM exits without another
// drain.
func (s *Service) handleDrain(w http.ResponseWriter, _ *http.Request) {
	s.log.Info("drain requested over /drain")
	s.out.Drain.Send(messages.Drain{Reason: "/drain", Exit: false})
	fmt.Fprintln(w, "OK")
}

// MaxChaosHold bounds /debug/chaos/kill's for=: a chaos suite holds a
// service down "for a while", and a typo (for=10h) must not leave an agent
// down for good.
const MaxChaosHold = time.Minute

// handleChaosKill makes the named service fail so that its supervisor must
// restart it; with for=DUR it stays failed until DUR has passed.
func (s *Service) handleChaosKill(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("service")
	var hold time.Duration
	if v := r.URL.Query().Get("for"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > MaxChaosHold {
			http.Error(w, fmt.Sprintf("bad for=%q: want a duration above 0 and at most %s", v, MaxChaosHold), http.StatusBadRequest)
			return
		}
		hold = d
	}
	t, _ := s.in.Tree.Get()
	for _, n := range t.Services {
		if n.Name != name {
			continue
		}
		if n.State == messages.Failed || n.State == messages.Stopped {
			http.Error(w, fmt.Sprintf("%s is not running (%s); nothing to kill", name, n.StateName), http.StatusConflict)
			return
		}
		s.log.Warn("chaos kill requested", "target", name, "for", hold)
		s.out.Chaos.Send(messages.Chaos{Service: name, For: hold})
		if hold > 0 {
			fmt.Fprintf(w, "killing %s; held down for %s\n", name, hold)
			return
		}
		fmt.Fprintf(w, "killing %s\n", name)
		return
	}
	http.Error(w, fmt.Sprintf("no service %q in the tree", name), http.StatusNotFound)
}

func postOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "method not allowed: use POST", http.StatusMethodNotAllowed)
			return
		}
		h(w, r)
	}
}

// loopbackOnly refuses callers that are not on this host: these endpoints
// stop, drain or break the agent, or show its insides. Only the connection's
// own address counts: X-Forwarded-For and the like are the caller's word.
func loopbackOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		ip := net.ParseIP(host)
		if err != nil || ip == nil || !ip.IsLoopback() {
			http.Error(w, "only allowed from localhost", http.StatusForbidden)
			return
		}
		h(w, r)
	}
}
