package appprobe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// AppProbersEnv is the variable the injector fills with the pod's rewritten
// probes (Istio's status.KubeAppProberEnvName).
const AppProbersEnv = "ISTIO_KUBE_APP_PROBERS"

// ErrInvalidAppProbe is wrapped by every error ParseAppProbers returns.
var ErrInvalidAppProbe = errors.New("invalid application probe")

// appProbePath is the form the injector gives a rewritten probe's path
// (Istio's appProberPattern; FormatProberURL makes these). Compiled on first
// use: a pod without application probes never needs it (#36).
var appProbePath = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^/(app-health|app-lifecycle)/[^/]+/(livez|readyz|startupz|prestopz|poststartz)$`)
})

// defaultProbeTimeout is kubelet's default timeoutSeconds. Istio uses 0 as
// it comes (no timeout for HTTP and TCP, an instant failure for gRPC); the
// injector always copies the pod's value, which the API server defaults to
// 1, so 0 only comes from a hand-written variable.
const defaultProbeTimeout = time.Second

// Config is the status server's probing of the application.
type Config struct {
	// App are the probes kubelet sends to /app-health/... and
	// /app-lifecycle/... (ISTIO_KUBE_APP_PROBERS, read by ParseAppProbers);
	// nil: every such path answers 400.
	App AppProbers
	// Host is where probes go: INSTANCE_IP, as kubelet would; "localhost"
	// when REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION=true. "" is localhost.
	Host string
	// DisableHTTP2: ISTIO_ENABLE_HTTP2_PROBING=false. By default HTTPS
	// probes may use HTTP/2, as kubelet's do.
	DisableHTTP2 bool
	// KeepAlive: ENABLE_PROBE_KEEPALIVE_CONNECTIONS=true keeps connections
	// to the application between probes (older Istio); by default each
	// probe opens its own, as kubelet's do.
	KeepAlive bool
	// Workload is ProxyConfig.readinessProbe (VMs: from the WorkloadGroup),
	// read by NewWorkloadProbe; nil: no workload probe runs.
	Workload *WorkloadProbe
}

// AppProbers are the application's probes that kubelet sends to the status
// server instead, by the path kubelet asks for ("/app-health/web/livez").
type AppProbers map[string]AppProbe

// AppProbe is one container probe as the injector writes it: the JSON of
// Kubernetes' probe handler (Istio's status.Prober, apimirror types).
// Exactly one of HTTPGet, TCPSocket and GRPC is set.
type AppProbe struct {
	HTTPGet   *HTTPGetAction   `json:"httpGet,omitempty"`
	TCPSocket *TCPSocketAction `json:"tcpSocket,omitempty"`
	GRPC      *GRPCAction      `json:"grpc,omitempty"`
	// TimeoutSeconds bounds one probe; 0 is kubelet's default, 1 second.
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
}

// HTTPGetAction is Kubernetes' httpGet probe. Host and HTTPHeaders are
// accepted and ignored, as Istio does: kubelet itself sends the headers to
// the status server, which copies them to the application.
type HTTPGetAction struct {
	Path        string       `json:"path,omitempty"`
	Port        ProbePort    `json:"port"`
	Host        string       `json:"host,omitempty"`
	Scheme      string       `json:"scheme,omitempty"` // "HTTP" (default) or "HTTPS"
	HTTPHeaders []HTTPHeader `json:"httpHeaders,omitempty"`
}

// urlScheme is the scheme the probe is sent with: kubelet's "HTTPS", else http.
func (g *HTTPGetAction) urlScheme() string {
	if g.Scheme == "HTTPS" {
		return "https"
	}
	return "http"
}

// urlPath is the probe's path, rooted as kubelet roots it.
func (g *HTTPGetAction) urlPath() string {
	if !strings.HasPrefix(g.Path, "/") {
		return "/" + g.Path
	}
	return g.Path
}

// HTTPHeader is one header of an httpGet probe.
type HTTPHeader struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// TCPSocketAction is Kubernetes' tcpSocket probe.
type TCPSocketAction struct {
	Port ProbePort `json:"port"`
	Host string    `json:"host,omitempty"`
}

// GRPCAction is Kubernetes' grpc probe: grpc.health.v1.Health/Check.
type GRPCAction struct {
	Port    ProbePort `json:"port"`
	Service *string   `json:"service,omitempty"`
}

// ProbePort is a probe's port. The injector resolves named ports to
// numbers; a name left in the variable is an error, as in Istio.
type ProbePort int

var errNamedPort = errors.New("the port must be a number (named ports are resolved by the injector)")

// UnmarshalJSON accepts a JSON number only.
func (p *ProbePort) UnmarshalJSON(b []byte) error {
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte(`"`)) {
		return fmt.Errorf("port %s: %w", b, errNamedPort)
	}
	var n int
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("port %s: %w", b, err)
	}
	*p = ProbePort(n)
	return nil
}

// ParseAppProbers reads the value of ISTIO_KUBE_APP_PROBERS; "" is no
// probes. Every error names the variable and, when it is about one probe,
// its path, and wraps ErrInvalidAppProbe.
func ParseAppProbers(value string) (AppProbers, error) {
	if strings.TrimSpace(value) == "" {
		return nil, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(value), &raw); err != nil {
		return nil, fmt.Errorf("%s: %w: not a JSON object of probes by path: %v", AppProbersEnv, ErrInvalidAppProbe, err)
	}
	paths := make([]string, 0, len(raw))
	for p := range raw {
		paths = append(paths, p)
	}
	sort.Strings(paths) // the first error is the same on every run
	probers := make(AppProbers, len(raw))
	for _, path := range paths {
		probe, err := parseAppProbe(path, raw[path])
		if err != nil {
			return nil, fmt.Errorf("%s: probe %q: %w: %v", AppProbersEnv, path, ErrInvalidAppProbe, err)
		}
		probers[path] = probe
	}
	return probers, nil
}

func parseAppProbe(path string, raw json.RawMessage) (AppProbe, error) {
	var p AppProbe
	if !appProbePath().MatchString(path) {
		return p, fmt.Errorf("the path must match %s", appProbePath())
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return p, err
	}
	return p, p.validate()
}

func (p AppProbe) validate() error {
	n := 0
	for _, set := range []bool{p.HTTPGet != nil, p.TCPSocket != nil, p.GRPC != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return errors.New("exactly one of httpGet, tcpSocket or grpc must be set")
	}
	if p.TimeoutSeconds < 0 {
		return fmt.Errorf("timeoutSeconds %d is negative", p.TimeoutSeconds)
	}
	switch {
	case p.HTTPGet != nil:
		if s := p.HTTPGet.Scheme; s != "" && s != "HTTP" && s != "HTTPS" {
			return fmt.Errorf("httpGet scheme %q: want HTTP or HTTPS", s)
		}
		return checkPort(p.HTTPGet.Port)
	case p.TCPSocket != nil:
		return checkPort(p.TCPSocket.Port)
	default:
		return checkPort(p.GRPC.Port)
	}
}

// checkPort rejects a port no connection can reach. Istio accepts them and
// fails every probe; failing at start says why.
func checkPort(p ProbePort) error {
	if p < 1 || p > 65535 {
		return fmt.Errorf("port %d is out of range 1-65535", p)
	}
	return nil
}

// timeout is the probe's timeout, kubelet's default for 0.
func (p AppProbe) timeout() time.Duration {
	if p.TimeoutSeconds <= 0 {
		return defaultProbeTimeout
	}
	return time.Duration(p.TimeoutSeconds) * time.Second
}
