package status

// The status server's bounds (#33): 2,000 concurrent app probes with
// 16 headers of 60 KiB each, in front of a slow application, took the
// agent from 39 MiB to 1.28 GB, where it stayed. Kubelet and Prometheus
// send small requests, few at once; nothing else that arrives on 15020
// gets more than they need. docs/bounds.md lists these with their reasons.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"golang.org/x/net/netutil"
)

const (
	// maxHeaderBytes bounds a request's line and headers (net/http allows
	// 4 KiB more, and answers 431 past it). Kubelet's probe sends a
	// User-Agent, an Accept and the pod spec's httpHeaders (a bearer
	// token is the largest one seen: a few KiB); a Prometheus scrape, an
	// Accept of ~200 bytes and three more. 32 KiB is eight times the
	// largest; Go's default is 1 MiB.
	maxHeaderBytes = 32 << 10
	// maxConns bounds the connections open at once; more wait in the
	// kernel's accept queue, not in the agent. Each costs at most its
	// header bytes, two 4 KiB buffers and a goroutine: ~50 KiB, so 512
	// hold ~25 MiB. Kubelet opens one per probe and closes it.
	maxConns = 512
	// readHeaderTimeout, readTimeout: a request (no endpoint takes a
	// body worth the name) arrives within them or the connection ends.
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	// writeTimeout bounds a response from the end of its request: longer
	// than any probe kubelet waits for in practice and than pprof's
	// default 30 s profile (pprof refuses a longer one by name).
	writeTimeout = 2 * time.Minute
	// idleTimeout ends a kept-alive connection nobody uses: longer than
	// Prometheus' usual scrape interval (15-60 s), so a scraper keeps its
	// connection.
	idleTimeout = 90 * time.Second
)

// routeClass groups endpoints that share a bound on requests at once.
type routeClass struct {
	name string
	max  int
}

var (
	// classProbes: kubelet sends at most three probes a container a
	// period (liveness, readiness, startup) and lifecycle hooks one at a
	// time; 32 covers ten containers probing at once. Each holds a copy
	// of its request's headers to the application while it waits.
	classProbes = routeClass{"application probes", 32}
	// classReady: kubelet through Envoy's 15021 and `meshagent wait`,
	// once a period each; the answer is a snapshot, cheap.
	classReady = routeClass{"readiness", 32}
	// classMetrics: one scrape per Prometheus per interval (two in an HA
	// pair) and a person; a merge reads Envoy's and the application's
	// metrics, the dearest thing the server does.
	classMetrics = routeClass{"metrics", 4}
	// classDebug: the loopback pages, /quitquitquit and /drain: an
	// operator, the preStop hook, the CLI.
	classDebug = routeClass{"debug", 8}
)

// classOf is the class of a route's pattern.
func classOf(pattern string) routeClass {
	_, path, _ := strings.Cut(pattern, " ")
	if path == "" {
		path = pattern
	}
	switch {
	case strings.HasPrefix(path, "/app-health/"), strings.HasPrefix(path, "/app-lifecycle/"):
		return classProbes
	case path == "/healthz/ready":
		return classReady
	case path == "/stats/prometheus", path == "/metrics":
		return classMetrics
	}
	return classDebug
}

// limiter holds one semaphore per route class, for the life of a Service
// (shared by its Serve runs: a restart does not double the bound).
type limiter map[routeClass]chan struct{}

func newLimiter() limiter {
	l := limiter{}
	for _, c := range []routeClass{classProbes, classReady, classMetrics, classDebug} {
		l[c] = make(chan struct{}, c.max)
	}
	return l
}

// wrap makes h answer 503 at once, naming the bound, when its class
// already serves its number of requests.
func (l limiter) wrap(pattern string, h http.HandlerFunc) http.HandlerFunc {
	c := classOf(pattern)
	slots := l[c]
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
			h(w, r)
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, fmt.Sprintf("%d %s requests already in progress (the bound); try again", c.max, c.name), http.StatusServiceUnavailable)
		}
	}
}

// newServer is the status server's http.Server with its bounds.
func newServer(ctx context.Context, h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
}

// limitListener bounds the connections open at once to maxConns.
func limitListener(ln net.Listener) net.Listener { return netutil.LimitListener(ln, maxConns) }
