// Package certs is the CertWatcher: it obtains the workload's identity, from
// file-mounted PEM files (followed with fsnotify) or from the control plane's
// CA (a CSR to IstioCertificateService, renewed before expiry), and publishes
// it as a messages.CertBundle (latest value) for the SDS server and the xDS
// proxy.
package certs

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
)

// Name is the service's name in logs, metrics, Health and /debug/tree.
const Name = "certs"

// Service is the CertWatcher.
type Service struct {
	cfg     Config
	anchors messages.Latest[messages.TrustAnchors] // nil: no such input
	out     messages.Sink[messages.CertBundle]
	health  *messages.Reporter
	log     *slog.Logger
	clock   messages.Clock
	m       metrics
	// early: the key generated ahead of the service (Config.EarlyKey),
	// until the first CSR takes it; touched only by Serve's goroutine.
	early *EarlyKey

	// Survive restarts; touched only by Serve's goroutine.
	caIssued messages.CertBundle // the CA's last certificate, with its root (zero if none)
	// caFailuresInARow counts the CA requests failed since the last success.
	caFailuresInARow int
	fileRoots        []byte // RootsFromFile: RootCertFile's last good content
	fileRootsErr     error  // RootsFromFile: why RootCertFile's content is not used now
	written          string // version last written to OutputCertsDir
	anchorsSeen      []byte // the trust anchors last read, joined (takeAnchors)

	// Survives restarts; touched only by Serve's goroutine, and read by
	// the metrics gauge, hence the mutex.
	mu      sync.Mutex
	current messages.CertBundle // last published bundle (zero if none)
}

// Inputs are what the CertWatcher reads besides its files and the CA.
type Inputs struct {
	// TrustAnchors: the ProxyConfig's caCertificatesPem, from the XDS
	// proxy (PROXY_CONFIG_XDS_AGENT). With the certificate from the CA, a
	// change of them asks the CA for a new certificate at once, as Istio's
	// UpdateConfigTrustBundle does. May be nil.
	TrustAnchors messages.Latest[messages.TrustAnchors]
}

// Outputs are what the CertWatcher publishes.
type Outputs struct {
	// Certs: the workload certificate with its roots, for SDS and the XDS
	// proxy.
	Certs messages.Sink[messages.CertBundle]
}

// New returns the CertWatcher, or why cfg cannot work (the only check of
// cfg).
func New(cfg Config, in Inputs, out Outputs, rt messages.Runtime) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if out.Certs == nil {
		return nil, errors.New("certs: Outputs.Certs is required")
	}
	s := &Service{cfg: cfg, anchors: in.TrustAnchors, out: out.Certs, health: rt.Health, log: rt.Log, clock: rt.Clock, early: cfg.EarlyKey}
	s.m = newMetrics(s.expirySeconds)
	if err := rt.Register(s.m.all...); err != nil {
		return nil, err
	}
	return s, nil
}

// String is the service's name in logs, metrics and /debug/tree.
func (s *Service) String() string { return Name }

// Serve runs until ctx is done. A bad or missing certificate is not an error: the service reports Degraded and keeps trying.
// The certificate comes from files or the CA (cfg.Source), the roots with it
// or, in Istio's mixed mode, from the other one (cfg.Roots).
func (s *Service) Serve(ctx context.Context) error {
	if s.cfg.Source == SourceFiles {
		return s.serveFiles(ctx)
	}
	return s.serveCA(ctx)
}

// publish sends b if its content differs from the last published bundle and
// writes OUTPUT_CERTS. It reports whether anything new was published.
func (s *Service) publish(b messages.CertBundle) bool {
	s.mu.Lock()
	same := s.current.Version == b.Version
	if !same {
		s.current = b
	}
	s.mu.Unlock()
	if same {
		return false
	}
	s.out.Send(b)
	s.log.Info("published workload certificate", "bundle", b)
	s.writeOutput(b)
	return true
}

// last returns the last published bundle (ok false if none).
func (s *Service) last() (messages.CertBundle, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current, s.current.Version != ""
}

func (s *Service) expirySeconds() float64 {
	b, ok := s.last()
	if !ok {
		return 0
	}
	return b.Expiry.Sub(s.clock.Now()).Seconds()
}

// report sends a health change; the Reporter drops repeats, so that a noisy
// directory does not flood the health stream.
func (s *Service) report(state messages.HealthState, reason string) {
	s.health.Report(state, reason)
}

// metrics follow Istio's names (security/pkg/monitoring, cache metrics).
type metrics struct {
	expiry          prometheus.Collector
	outgoing        *prometheus.CounterVec
	outgoingFailed  *prometheus.CounterVec
	watcherFailures prometheus.Counter
	fileFailures    prometheus.Counter

	all []prometheus.Collector // every one above, to register
}

func newMetrics(expiry func() float64) metrics {
	var mm messages.Metrics
	m := metrics{
		expiry: messages.Add(&mm, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "cert_expiry_seconds",
			Help:        "The time remaining, in seconds, before the certificate chain will expire. A negative value indicates the cert is expired.",
			ConstLabels: prometheus.Labels{"resource_name": "default"},
		}, expiry)),
		outgoing: mm.CounterVec("num_outgoing_requests",
			"Number of total outgoing requests (e.g. to a token exchange server, CA, etc.)", "request_type"),
		outgoingFailed: mm.CounterVec("num_failed_outgoing_requests",
			"Number of failed outgoing requests (e.g. to a token exchange server, CA, etc.)", "request_type"),
		watcherFailures: mm.Counter("num_file_watcher_failures_total", "Number of times file watcher failed to add watchers"),
		fileFailures:    mm.Counter("num_file_secret_failures_total", "Number of times secret generation failed for files"),
	}
	m.all = mm.Collectors()
	return m
}
