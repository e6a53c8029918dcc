package messages

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"
)

// ErrRestart, returned (or wrapped) by a service's Serve, asks the tree to run
// the service again at once. It is a deliberate restart, such as Envoy picking
// up a new bootstrap, and does not count as a failure.
var ErrRestart = errors.New("restart requested")

// CertBundle is the workload's identity: its certificate chain, private key
// and trusted roots, all PEM. From certs to sds and xds, latest value.
type CertBundle struct {
	CertChainPEM []byte
	KeyPEM       []byte
	RootsPEM     []byte
	// Expiry is the NotAfter of the leaf certificate.
	Expiry time.Time
	// Version changes when, and only when, the content changes.
	Version string
	// RenewAt is when the certificate watcher asks the CA for the next
	// certificate; zero when it does not (file-mounted certificates). Not
	// content: Version does not depend on it. Shown by /debug/certs (#22).
	RenewAt time.Time
}

// String never prints the private key.
func (b CertBundle) String() string {
	return fmt.Sprintf("CertBundle{version=%s expiry=%s chain=%dB key=[redacted] roots=%dB}",
		b.Version, b.Expiry.Format(time.RFC3339), len(b.CertChainPEM), len(b.RootsPEM))
}

// LogValue keeps the private key out of structured logs.
func (b CertBundle) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("version", b.Version),
		slog.Time("expiry", b.Expiry),
		slog.Int("chain_bytes", len(b.CertChainPEM)),
		slog.Int("roots_bytes", len(b.RootsPEM)),
	)
}

// NameTable is the mesh's DNS name table as Istio's NDS sends it
// (istio.networking.nds.v1.NameTable), as plain Go values. From xds (or a
// file) to dns, latest value.
type NameTable struct {
	// Hosts maps a host name (as the control plane sends it, e.g.
	// "reviews.default.svc.cluster.local") to what is known about it.
	Hosts map[string]NameInfo
	// Version identifies this table (the NDS response version, or the file's).
	Version string
}

// DNSTable is the name table the DNS proxy answers from, and what it
// expands the names with (its namespace and cluster domain: the alt hosts
// of a Kubernetes service). From dns to whoever shows it (/debug/ndsz,
// issue 34), latest value: the DNS proxy publishes it and is never called.
type DNSTable struct {
	// Table is the NameTable as the DNS proxy received it; shared, never
	// modified.
	Table     NameTable
	Namespace string
	Domain    string
}

// NameInfo mirrors istio.networking.nds.v1.NameTable.NameInfo.
type NameInfo struct {
	IPs       []netip.Addr
	Registry  string // "Kubernetes" for services of the cluster
	Shortname string
	Namespace string
	AltHosts  []string
}

// HealthState is a service's condition as the status server sees it.
type HealthState int

const (
	// Starting: running but not yet able to do its job.
	Starting HealthState = iota
	// Ready: doing its job.
	Ready
	// Degraded: doing its job on stale input (a bad cert update, say).
	Degraded
	// Failed: not running; the tree will restart it.
	Failed
	// Stopped: stopped on purpose.
	Stopped
)

var healthStateNames = [...]string{Starting: "starting", Ready: "ready", Degraded: "degraded", Failed: "failed", Stopped: "stopped"}

func (s HealthState) String() string { return enumName(healthStateNames[:], s, "HealthState") }

// Serving reports whether a service in this state counts as ready.
func (s HealthState) Serving() bool { return s == Ready || s == Degraded }

// Health is one service's report about itself (or the tree's report about a
// service). From every service and the tree to status, event stream.
type Health struct {
	Service string // the service's String(), e.g. "dns"
	State   HealthState
	Reason  string // why, when not Ready; shown by /healthz/ready and /debug/tree
	Time    time.Time
}

// EnvoyPhase is where an Envoy process is in its life. It is one value, so
// that impossible combinations ("ready but not running") cannot be written.
//
//	EnvoyStarting → EnvoyRunning → EnvoyReady → EnvoyDraining → EnvoyStopped
//	                     └──────────────┴─────────────┴──────→ EnvoyExited
type EnvoyPhase int

const (
	// EnvoyStarting: no Envoy yet (the bootstrap is being written, or the
	// service has not run). The zero value.
	EnvoyStarting EnvoyPhase = iota
	// EnvoyRunning: the process runs but is not ready.
	EnvoyRunning
	// EnvoyReady: the process runs and is ready to serve traffic.
	EnvoyReady
	// EnvoyDraining: a drain has begun; the process still runs.
	EnvoyDraining
	// EnvoyExited: the process ended without being asked to; the tree
	// will start another (or give up).
	EnvoyExited
	// EnvoyStopped: stopped on purpose (after a drain, or at shutdown); no
	// other Envoy follows. The tree waits for it before stopping the rest.
	EnvoyStopped
)

var envoyPhaseNames = [...]string{EnvoyStarting: "starting", EnvoyRunning: "running", EnvoyReady: "ready",
	EnvoyDraining: "draining", EnvoyExited: "exited", EnvoyStopped: "stopped"}

func (p EnvoyPhase) String() string { return enumName(envoyPhaseNames[:], p, "EnvoyPhase") }

// Alive reports whether a process is running in this phase.
func (p EnvoyPhase) Alive() bool {
	return p == EnvoyRunning || p == EnvoyReady || p == EnvoyDraining
}

// EnvoyState is what the envoy service knows of its child process. From envoy
// to status and xds, latest value.
type EnvoyState struct {
	Phase EnvoyPhase
	// Epoch counts the Envoy processes this agent started, from 0.
	Epoch   int
	PID     int
	Started time.Time
	// ExitCode is Envoy's exit status once it has exited (-1 if killed by
	// a signal); ExitReason says how it ended ("exit status 1",
	// "signal: killed", ...). Kept across the next start, so that
	// readiness can say why the last one ended.
	ExitCode   int
	ExitReason string
	// NotReady says why a running Envoy is not ready yet, as its admin API
	// tells ("config not received: cds updates 0, lds updates 0").
	NotReady string
	// RestartEpoch is Envoy's --restart-epoch: 0 without hot restart, and
	// with it 0 for an Envoy that has no parent, one more than its
	// parent's for a hot restart (#25).
	RestartEpoch int
	// Overlap is the other Envoy of a hot restart under way (#25); its PID
	// is 0 when only one Envoy runs. The fields above describe the Envoy
	// that serves: the old one while the new one (Overlap, EnvoyRunning)
	// starts, then the new one while the old one (Overlap, EnvoyDraining)
	// drains. Readiness therefore stays up through a hot restart.
	Overlap EnvoyProcess
}

// EnvoyProcess is one Envoy process of a hot restart's overlap (#25).
type EnvoyProcess struct {
	Phase        EnvoyPhase
	Epoch, PID   int
	RestartEpoch int
	Started      time.Time
}

// Drain asks the envoy service to drain Envoy. From status and the signal
// handler (via the tree) to envoy, command stream.
type Drain struct {
	Reason string
	// Deadline is when the drain must end; zero means the configured
	// termination drain duration from now.
	Deadline time.Time
	// Exit: after draining, stop Envoy and report Stopped. False is Istio's
	// POST /drain: drain listeners and keep running until told to exit.
	Exit bool
	// Immediate skips draining (Istio's /quitquitquit): stop Envoy now.
	Immediate bool
}

// Shutdown asks the tree to stop the agent. From status (/quitquitquit) and
// the signal handler to tree, command stream.
type Shutdown struct {
	Reason string
	// Graceful drains Envoy first; false stops at once (a second signal,
	// /quitquitquit).
	Graceful bool
}

// Chaos asks the tree to make a service fail, so that its supervisor must
// restart it. From status (/debug/chaos/kill, when chaos is enabled) to tree.
type Chaos struct {
	Service string
	// For holds the service down that long after the kill (0: restart it
	// as any failure): a chaos suite stops the control plane "for a
	// while" this way, without the kills counting toward its give-up limit.
	For time.Duration
}

// ServiceInfo is one node of the supervision tree as /debug/tree shows it.
type ServiceInfo struct {
	Name      string      `json:"name"`
	Path      string      `json:"path"` // "names/dns"
	Kind      string      `json:"kind"` // "service" or "supervisor"
	State     HealthState `json:"-"`
	StateName string      `json:"state"`
	Reason    string      `json:"reason,omitempty"`
	Restarts  int         `json:"restarts"`
	Panics    int         `json:"panics"`
	// StopTimeouts counts the times the service overran its stop timeout
	// (it ignored cancellation); its old run may still be inside Serve.
	StopTimeouts int           `json:"stop_timeouts,omitempty"`
	Failures     int           `json:"consecutive_failures"`
	LastError    string        `json:"last_error,omitempty"`
	NextDelay    time.Duration `json:"next_delay_ns,omitempty"`
	Since        time.Time     `json:"since"`
}

// TreeState is the whole tree, in depth-first order. From tree to status,
// latest value.
type TreeState struct {
	Services []ServiceInfo
}

// Readiness is the agent's overall readiness as /healthz/ready answers it.
// From status to tree (for systemd's READY=1), latest value.
type Readiness struct {
	Ready  bool
	Reason string
}

// AgentService is the name under which the tree reports the agent's own
// Health: Stopped while shutting down, so that readiness fails at once.
const AgentService = "agent"

// EnvoyService is the name of the service that runs Envoy: the tree drains
// it first at shutdown, the status server explains Envoy's readiness by it.
const EnvoyService = "envoy"

// XDSUpstream is the XDS proxy's connection to the control plane.
type XDSUpstream int

const (
	// XDSIdle: no Envoy (or gRPC client) stream, so no upstream stream.
	XDSIdle XDSUpstream = iota
	// XDSConnecting: dialling the control plane.
	XDSConnecting
	// XDSConnected: an upstream stream is open.
	XDSConnected
	// XDSServingCache: the control plane cannot be reached and the proxy
	// serves its last-known-good configuration to Envoy.
	XDSServingCache
	// XDSDown: the control plane cannot be reached and there is nothing
	// cached to serve.
	XDSDown
)

var xdsUpstreamNames = [...]string{XDSIdle: "idle", XDSConnecting: "connecting", XDSConnected: "connected",
	XDSServingCache: "serving cached configuration", XDSDown: "down"}

func (u XDSUpstream) String() string { return enumName(xdsUpstreamNames[:], u, "XDSUpstream") }

// enumName is the String of the enums above: its name from a table keyed
// by the constants (so a constant added without a name shows as
// "Type(N)", not a wrong word), else "Type(N)" as fmt would print it.
func enumName[E ~int](names []string, v E, typ string) string {
	if v >= 0 && int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, int(v))
}

// XDSState is what the XDS proxy knows of its upstream. From xds to status,
// latest value.
type XDSState struct {
	Upstream XDSUpstream
	Address  string // the control plane's address (discoveryAddress)
	// Since is when Upstream took its current value ("control plane
	// unreachable since T" while serving the cache).
	Since     time.Time
	LastError string
	// LastACK is, per type URL, the version Envoy last acknowledged.
	LastACK map[string]string
	// Types is, per type URL forwarded to Envoy, what the control plane
	// last sent, what Envoy last ACKed and its last NACK (issue 22).
	Types map[string]XDSTypeState
}

// XDSTypeState is one xDS type between the proxy and Envoy.
type XDSTypeState struct {
	// Sent is the last response forwarded to Envoy (or served from the
	// cache).
	SentVersion   string    `json:"sent_version"`
	SentNonce     string    `json:"sent_nonce"`
	SentResources int       `json:"sent_resources"`
	SentAt        time.Time `json:"sent_at"`
	// ACKed is the last version Envoy acknowledged.
	ACKedVersion string    `json:"acked_version"`
	ACKedAt      time.Time `json:"acked_at"`
	// NACK is Envoy's last rejection, until it ACKs a later response.
	NACK *XDSNack `json:"nack,omitempty"`
	// NACKs counts the rejections of this type since the agent started.
	NACKs int `json:"nacks"`
}

// XDSNack is a response Envoy rejected.
type XDSNack struct {
	Version string    `json:"version"` // of the rejected response, when known
	Nonce   string    `json:"nonce"`
	Error   string    `json:"error"` // Envoy's error_detail: it names the rejected resources
	At      time.Time `json:"at"`
}

// Verdicts of one xDS type, as istioctl proxy-status names them.
const (
	VerdictSynced       = "SYNCED"
	VerdictStale        = "STALE"
	VerdictNACKed       = "NACKED"
	VerdictServingCache = "SERVING CACHE"
	VerdictNotSent      = "NOT SENT"
)

// Verdict is what an operator asks of a type: NACKED while Envoy's last
// word on it is a rejection; SERVING CACHE while the control plane is
// unreachable and the cache is served; STALE when a response has waited
// for its ACK longer than staleAfter; else SYNCED.
func (s XDSState) Verdict(typeURL string, now time.Time, staleAfter time.Duration) string {
	t, ok := s.Types[typeURL]
	switch {
	case !ok || t.SentAt.IsZero():
		return VerdictNotSent
	case t.NACK != nil:
		return VerdictNACKed
	case s.Upstream == XDSServingCache:
		return VerdictServingCache
	case t.ACKedVersion != t.SentVersion && now.Sub(t.SentAt) > staleAfter:
		return VerdictStale
	}
	return VerdictSynced
}

// TrustAnchors are extra roots from the ProxyConfig the control plane sends
// over xDS (caCertificatesPem, with PROXY_CONFIG_XDS_AGENT). From xds to sds,
// latest value: SDS serves them in ROOTCA beside the mesh roots.
type TrustAnchors struct {
	PEM     [][]byte
	Version string
}

// WorkloadHealth is the application's health by the readiness probe the
// control plane configured for a VM workload (ProxyConfig.readinessProbe,
// from its WorkloadGroup). From status (which runs the probe) to xds, which
// reports transitions upstream as Istio's HealthInformation, latest value.
type WorkloadHealth struct {
	Healthy bool
	// Reason says why not, as the probe saw it ("GET http://10.0.0.5:8080/ready: 503").
	Reason string
}
