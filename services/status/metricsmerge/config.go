package metricsmerge

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// PrometheusAnnotationsEnv is the variable the injector fills with the
// pod's prometheus.io/{scrape,path,port} annotations (and Istio's
// prometheus.istio.io/scrape-targets), as JSON.
const PrometheusAnnotationsEnv = "ISTIO_PROMETHEUS_ANNOTATIONS"

// ErrInvalidScrapeConfig is wrapped by every error ParsePrometheusAnnotations
// returns.
var ErrInvalidScrapeConfig = errors.New("invalid prometheus scrape configuration")

// defaultMetricsBodyLimit caps each source's answer (Istio's
// defaultMaxAppMetricsBodyBytes): a misbehaving application must not make
// the agent hold an unbounded body per scrape.
const defaultMetricsBodyLimit = 10 << 20

// Config is the merged Prometheus endpoint, /stats/prometheus and
// /metrics: the agent's own metrics, then Envoy's, then the application's.
type Config struct {
	// EnvoyPort is Envoy's Prometheus port on localhost
	// (ENVOY_PROMETHEUS_PORT, default 15090). 0: Envoy's metrics are not
	// merged (PILOT_AGENT_MERGE_ENVOY_STATS=false, or DISABLE_ENVOY=true).
	EnvoyPort int
	// App are the application's endpoints on localhost
	// (ISTIO_PROMETHEUS_ANNOTATIONS, read by ParsePrometheusAnnotations;
	// Istio reads it for sidecars only). Empty: none.
	App []ScrapeTarget
	// LocalhostOnly refuses (403) callers not on this host
	// (METRICS_LOCALHOST_ACCESS_ONLY=true).
	LocalhostOnly bool
	// BodyLimit caps each source's answer; a larger one is skipped and
	// counted as a failure. 0 is 10 MiB, as Istio's cap on an
	// application's answer.
	BodyLimit int64
}

// ScrapeTarget is one application endpoint: http://localhost:<Port><Path>.
type ScrapeTarget struct {
	Port int
	Path string
}

// reservedPortUse says what an agent or Envoy port is for, if port is one
// (Istio's istioReservedPorts): scraping it as the application would loop
// back into this endpoint or count Envoy twice.
func reservedPortUse(port int) (string, bool) {
	switch port {
	case 15000:
		return "Envoy admin", true
	case 15001:
		return "outbound traffic capture", true
	case 15004:
		return "pilot debug", true
	case 15006:
		return "inbound traffic capture", true
	case 15008:
		return "HBONE tunnel", true
	case 15020:
		return "agent status and merged metrics", true
	case 15021:
		return "Envoy health", true
	case 15053:
		return "DNS proxy", true
	case 15090:
		return "Envoy Prometheus, already merged", true
	}
	return "", false
}

// prometheusAnnotations is the JSON the injector writes (Istio's
// PrometheusScrapeConfiguration). Ports are strings there; numbers are
// accepted too.
type prometheusAnnotations struct {
	Scrape  string      `json:"scrape"`
	Path    string      `json:"path"`
	Port    json.Number `json:"port"`
	Targets []struct {
		Port json.Number `json:"port"`
		Path string      `json:"path"`
	} `json:"targets,omitempty"`
}

// ParsePrometheusAnnotations reads the value of ISTIO_PROMETHEUS_ANNOTATIONS:
// "" or scrape "false" is no application scrape; otherwise the targets, or
// the one endpoint at path (default /metrics) and port (default 80).
// agentPorts are the configured status and admin ports, refused as Istio's
// fixed ports are. Every error names the variable and wraps
// ErrInvalidScrapeConfig.
func ParsePrometheusAnnotations(value string, agentPorts ...int) ([]ScrapeTarget, error) {
	if strings.TrimSpace(value) == "" {
		return nil, nil
	}
	var a prometheusAnnotations
	if err := json.Unmarshal([]byte(value), &a); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", PrometheusAnnotationsEnv, ErrInvalidScrapeConfig, err)
	}
	if a.Scrape == "false" {
		return nil, nil
	}
	type raw struct{ port, path string }
	var raws []raw
	for _, t := range a.Targets {
		raws = append(raws, raw{t.Port.String(), t.Path})
	}
	if len(raws) == 0 {
		raws = []raw{{a.Port.String(), a.Path}}
		if raws[0].port == "" {
			raws[0].port = "80"
		}
	}
	targets := make([]ScrapeTarget, 0, len(raws))
	for _, r := range raws {
		t, err := scrapeTarget(r.port, r.path, agentPorts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w: %v", PrometheusAnnotationsEnv, ErrInvalidScrapeConfig, err)
		}
		targets = append(targets, t)
	}
	return targets, nil
}

func scrapeTarget(port, path string, agentPorts []int) (ScrapeTarget, error) {
	// Numerically, as Istio now does, so that "015020" is caught as 15020.
	n, err := strconv.Atoi(strings.TrimSpace(port))
	if err != nil || n < 1 || n > 65535 {
		return ScrapeTarget{}, fmt.Errorf("port %q is not a port number", port)
	}
	for _, p := range agentPorts {
		if p == n {
			return ScrapeTarget{}, fmt.Errorf("port %d is the agent's own port; scraping it would loop "+
				"(does the pod carry prometheus.io/port=%d, or was it injected twice?)", n, n)
		}
	}
	if why, ok := reservedPortUse(n); ok {
		return ScrapeTarget{}, fmt.Errorf("port %d is reserved for Istio (%s)", n, why)
	}
	if path == "" {
		path = "/metrics"
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return ScrapeTarget{Port: n, Path: path}, nil
}
