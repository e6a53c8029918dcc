// Package xdsproxy is the agent's XDS proxy: Envoy (or a proxyless gRPC
// client) talks xDS to it over a unix socket, and it holds the one
// authenticated stream per Envoy stream to the control plane, as Istio's
// agent does (pkg/istio-agent/xds_proxy.go, xds_proxy_delta.go).
//
// What it adds to a plain forwarder:
//   - the agent's own types are consumed here and never reach Envoy: the
//     DNS name table (NDS), the ProxyConfig's extra trust anchors, and the
//     VM workload's health, reported upstream;
//   - responses are forwarded as the raw bytes the control plane sent
//     (package rawxds): only the type URL and nonce are read from them;
//   - the configuration Envoy last acknowledged is kept, in memory and in a
//     file, and served to an Envoy that connects while the control plane
//     cannot be reached (package lkg, offline.go), which no peer does;
//   - new trust roots end the upstream stream, which is dialled again with
//     them, instead of restarting anything (roots.go, #26).
//
// What stands alone is a package of its own (#34): rawxds, the wire format
// of the responses it forwards undecoded; lkg, the last-known-good cache
// and its file; grpcbootstrap, the bootstrap file proxyless gRPC reads.
package xdsproxy

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshagent/meshagent/messages/compliance"
	"github.com/meshagent/meshagent/services/internal/uds"
	"github.com/meshagent/meshagent/services/xdsproxy/grpcbootstrap"
	"github.com/meshagent/meshagent/services/xdsproxy/wasm"
)

// Name is the service's name in logs, metrics, health and /debug/tree.
const Name = "xds"

// The proxy's own tuning, which no variable sets: Istio's where it has
// one, ours where it has none. What a variable sets (GRPC_KEEPALIVE_*,
// XDS_OFFLINE_CACHE, ...) and Istio's paths and addresses are the caller's,
// from cmd's env table (#34).
const (
	// DefaultDialTimeout bounds the opening of an upstream stream (Istio's
	// 5s dial context).
	DefaultDialTimeout = 5 * time.Second
	// DefaultStallTimeout: ours. A control plane that answers nothing for
	// this long while requests wait is treated as gone (istio/istio#57064:
	// an agent stuck for two days on a stream that never answered, which
	// keepalive did not detect because the connection itself was alive).
	// Control planes answer in seconds even under load, so two minutes
	// never cuts a slow but working one.
	DefaultStallTimeout = 2 * time.Minute
	// DefaultCacheMaxBytes bounds the last-known-good configuration, in
	// memory and on disk. 10,000 clusters with their endpoints, listeners and
	// routes take a few MiB.
	DefaultCacheMaxBytes = 64 << 20
	// DefaultReconnectBackoff and DefaultReconnectBackoffMax pace the
	// attempts to reach the control plane while the cache is served
	// (Envoy's own xDS retry uses 500ms doubling up to 30s).
	DefaultReconnectBackoff    = 500 * time.Millisecond
	DefaultReconnectBackoffMax = 30 * time.Second
	// DefaultStopTimeout bounds the graceful stop of the gRPC server.
	DefaultStopTimeout = 5 * time.Second
)

// ControlPlaneRootsSource says where the roots that verify the control
// plane's certificate come from (not the mesh roots served to Envoy, the
// certs service's MeshRootsSource; #26). The caller applies Istio's order
// (FindRootCAForXDS) and names the outcome here:
//
//	XDS_ROOT_CA=SYSTEM                          → RootsSystem
//	XDS_ROOT_CA=<file>                          → RootsFile, RootCAFile=<file>
//	./etc/certs/root-cert.pem exists            → RootsFile, RootCAFile=that file
//	PROV_CERT=<dir>                             → RootsFile, RootCAFile=<dir>/root-cert.pem
//	file-mounted certs (FILE_MOUNTED_CERTS)     → RootsCertBundle
//	otherwise                                   → RootsFile, RootCAFile=./var/run/secrets/istio/root-cert.pem
type ControlPlaneRootsSource int

const (
	// RootsFile: the PEM file RootCAFile, read again for every connection
	// (a rotated root is used by the next connection, as in Istio).
	RootsFile ControlPlaneRootsSource = iota
	// RootsSystem: the operating system's roots (XDS_ROOT_CA=SYSTEM).
	RootsSystem
	// RootsCertBundle: the roots of the latest CertBundle (file-mounted
	// certs, whose root-cert.pem the certs service watches).
	RootsCertBundle
)

func (r ControlPlaneRootsSource) String() string {
	switch r {
	case RootsFile:
		return "file"
	case RootsSystem:
		return "system"
	case RootsCertBundle:
		return "cert bundle"
	}
	return fmt.Sprintf("ControlPlaneRootsSource(%d)", int(r))
}

// Config is the XDS proxy's configuration: plain values, resolved by the
// caller from Istio's flags, environment and ProxyConfig. A zero tuning
// duration or size (DialTimeout, ..., CacheMaxBytes) means its default
// above; a variable's value is taken as given. A field tagged env:"NAME"
// takes that variable's value (testkit.FillFromTable).
type Config struct {
	// SocketPath is the unix socket Envoy connects to:
	// <root>/etc/istio/proxy/XDS (Istio: <ConfigPath>/XDS).
	SocketPath string
	// SocketOwner: who the socket is chowned to (default uds.Unowned).
	SocketOwner uds.Owner
	// KeepaliveInterval, KeepaliveTimeout: HTTP/2 keepalive on both sides
	// (GRPC_KEEPALIVE_INTERVAL, GRPC_KEEPALIVE_TIMEOUT), handed to gRPC as
	// Istio's agent hands them (pkg/keepalive): 0 is gRPC's own meaning,
	// as in Istio, not a default of ours. Upstream, an interval under 10s
	// (0 too) is gRPC's floor, 10s; downstream, 0 is gRPC's server
	// default, 2h; a timeout of 0 is gRPC's 20s on both sides.
	KeepaliveInterval time.Duration `env:"GRPC_KEEPALIVE_INTERVAL"`
	KeepaliveTimeout  time.Duration `env:"GRPC_KEEPALIVE_TIMEOUT"`

	// DiscoveryAddress is the control plane, host:port
	// (ProxyConfig.discoveryAddress).
	DiscoveryAddress string
	// Plaintext: no TLS to the control plane
	// (ProxyConfig.controlPlaneAuthPolicy: NONE).
	Plaintext bool
	// CompliancePolicy (COMPLIANCE_POLICY) sets the TLS versions, suites
	// and curves of the connection to the control plane, as Istio's
	// EnforceGoCompliance does to its XDS client (#35).
	CompliancePolicy compliance.Policy
	// Roots and RootCAFile: see ControlPlaneRootsSource.
	Roots      ControlPlaneRootsSource
	RootCAFile string
	// ServerName is the name verified in the control plane's certificate
	// (ISTIOD_SAN). Empty: the host of DiscoveryAddress, "localhost" (a
	// port-forward) meaning istiod.istio-system.svc, as Istio does.
	ServerName string
	// ClientCertificate presents the workload certificate of the latest
	// CertBundle to the control plane (file-mounted certs, read from
	// ISTIO_META_TLS_CLIENT_CERT_CHAIN/_KEY by the certs service). An
	// expired one is not sent, the token is enough (Istio's behaviour).
	ClientCertificate bool
	// ProvCertDir presents a provisioning certificate instead (PROV_CERT, a
	// VM's /etc/certs): its cert-chain.pem and key.pem, read at every
	// connection, none when missing or expired (Istio's GetKeyCertsForXDS).
	// It excludes ClientCertificate.
	ProvCertDir string
	// TokenFile holds the JWT sent as "authorization: Bearer <token>" on
	// every upstream stream, read afresh each time; a missing file sends no
	// header (Istio: ./var/run/secrets/tokens/istio-token). Empty: none.
	TokenFile string
	// ClusterID is sent as the "ClusterID" metadata (ISTIO_META_CLUSTER_ID).
	ClusterID string
	// Headers are extra metadata on every upstream stream (XDS_HEADER_<K>=V
	// gives K: V).
	Headers map[string]string
	// DialTimeout bounds the opening of an upstream stream (default 5s).
	DialTimeout time.Duration
	// StallTimeout ends a stream whose control plane has neither answered
	// nor accepted anything for this long while requests wait (ours; default
	// 2m; istio/istio#57064).
	StallTimeout time.Duration

	// NDS asks the control plane for the DNS name table on the first LDS
	// request of each stream and publishes it (the DNS proxy is on:
	// ISTIO_META_DNS_CAPTURE / ISTIO_META_DNS_AUTO_ALLOCATE).
	NDS bool
	// ProxyConfigXDS asks for the ProxyConfig over xDS and publishes its
	// caCertificatesPem as trust anchors (PROXY_CONFIG_XDS_AGENT).
	ProxyConfigXDS bool
	// HealthUpdates sends the workload's health transitions upstream as
	// HealthInformation requests (VMs whose WorkloadGroup has a readiness
	// probe: ProxyConfig.readinessProbe).
	HealthUpdates bool

	// OfflineCache keeps the configuration Envoy last acknowledged and
	// serves it to an Envoy that connects while the control plane cannot be
	// reached (ours: XDS_OFFLINE_CACHE).
	OfflineCache bool `env:"XDS_OFFLINE_CACHE"`
	// CacheFile persists it (0600, written atomically); empty keeps it in
	// memory only. The caller passes <ConfigPath>/xds-cache.pb.
	CacheFile string
	// CacheMaxBytes bounds it (default 64 MiB): a larger configuration is
	// not cached, with a warning.
	CacheMaxBytes int64
	// NodeID is Envoy's node id (sidecar~<ip>~<pod>.<ns>~<ns>.svc.cluster.local).
	// The cache holds only what this node acknowledged, and a cache file
	// written for another node or control plane is ignored.
	NodeID string
	// ReconnectBackoff, ReconnectBackoffMax pace the attempts to reach the
	// control plane while the cache is served (defaults 500ms, 30s).
	ReconnectBackoff    time.Duration
	ReconnectBackoffMax time.Duration

	// GRPCBootstrap, when its Path is set, is written when Serve starts
	// (GRPC_XDS_BOOTSTRAP): the bootstrap proxyless gRPC clients read.
	GRPCBootstrap grpcbootstrap.Config

	// StopTimeout bounds the graceful stop at shutdown before open streams
	// are cut (default 5s).
	StopTimeout time.Duration

	// Wasm: the ECDS resources whose Wasm code is remote are rewritten to
	// modules fetched into Wasm.Dir (Istio's /var/lib/istio/data), as
	// Istio's agent does (#35); Dir empty forwards ECDS unchanged.
	Wasm wasm.Config
}

// NewConfig is the config of a proxy serving Envoy on socketPath with the
// service's own defaults: the socket's owner left alone, TLS with roots from
// a file (RootCAFile is the caller's to set). The last-known-good cache
// (XDS_OFFLINE_CACHE) and the keepalive are the caller's to set.
func NewConfig(socketPath string) Config {
	return Config{
		SocketPath:  socketPath,
		SocketOwner: uds.Unowned,
		Roots:       RootsFile,
	}
}

// ErrBadConfig is wrapped by every Validate error.
var ErrBadConfig = errors.New("bad xds proxy configuration")

// withDefaults fills the zero tuning durations and sizes.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.DialTimeout, DefaultDialTimeout)
	def(&c.StallTimeout, DefaultStallTimeout)
	def(&c.ReconnectBackoff, DefaultReconnectBackoff)
	def(&c.ReconnectBackoffMax, DefaultReconnectBackoffMax)
	def(&c.StopTimeout, DefaultStopTimeout)
	if c.CacheMaxBytes == 0 {
		c.CacheMaxBytes = DefaultCacheMaxBytes
	}
	return c
}

// Validate names the field (and the Istio setting behind it) and the value
// that are wrong.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	if c.SocketPath == "" || !filepath.IsAbs(c.SocketPath) {
		return bad("SocketPath %q must be an absolute path", c.SocketPath)
	}
	// sun_path is 108 bytes on Linux, including the terminating NUL.
	if len(c.SocketPath) > 107 {
		return bad("SocketPath %q is %d bytes; a unix socket path must be at most 107", c.SocketPath, len(c.SocketPath))
	}
	host, port, err := net.SplitHostPort(c.DiscoveryAddress)
	if err != nil || host == "" || port == "" {
		return bad("DiscoveryAddress (ProxyConfig.discoveryAddress) %q must be host:port", c.DiscoveryAddress)
	}
	for name, d := range map[string]time.Duration{
		"KeepaliveInterval (GRPC_KEEPALIVE_INTERVAL)": c.KeepaliveInterval,
		"KeepaliveTimeout (GRPC_KEEPALIVE_TIMEOUT)":   c.KeepaliveTimeout,
		"DialTimeout":         c.DialTimeout,
		"StallTimeout":        c.StallTimeout,
		"ReconnectBackoff":    c.ReconnectBackoff,
		"ReconnectBackoffMax": c.ReconnectBackoffMax,
		"StopTimeout":         c.StopTimeout,
	} {
		if d < 0 {
			return bad("%s %v must not be negative", name, d)
		}
	}
	if c.ReconnectBackoffMax < c.ReconnectBackoff {
		return bad("ReconnectBackoffMax %v is less than ReconnectBackoff %v", c.ReconnectBackoffMax, c.ReconnectBackoff)
	}
	if !c.Plaintext {
		switch c.Roots {
		case RootsFile:
			if c.RootCAFile == "" {
				return bad("RootCAFile (XDS_ROOT_CA) is empty with Roots=file and TLS to the control plane (controlPlaneAuthPolicy is not NONE)")
			}
		case RootsSystem, RootsCertBundle:
		default:
			return bad("Roots %d is not a ControlPlaneRootsSource", int(c.Roots))
		}
	}
	if _, err := compliance.Parse(string(c.CompliancePolicy)); err != nil {
		return bad("CompliancePolicy (COMPLIANCE_POLICY): %v", err)
	}
	if c.ClientCertificate && c.ProvCertDir != "" {
		return bad("ClientCertificate (file-mounted certs) and ProvCertDir (PROV_CERT %q) are both set: one client certificate is presented", c.ProvCertDir)
	}
	for k := range c.Headers {
		// gRPC lower-cases metadata keys itself; a space, a colon or a
		// "grpc-" prefix cannot be sent.
		if k == "" || strings.ContainsAny(k, " \t\r\n:") || strings.HasPrefix(strings.ToLower(k), "grpc-") {
			return bad("Headers (XDS_HEADER_*) has an invalid key %q", k)
		}
	}
	if c.CacheMaxBytes < 0 {
		return bad("CacheMaxBytes %d must not be negative", c.CacheMaxBytes)
	}
	if c.OfflineCache && c.NodeID == "" {
		return bad("NodeID is empty with OfflineCache (XDS_OFFLINE_CACHE) on: the cache must know whose configuration it holds")
	}
	if c.CacheFile != "" && !filepath.IsAbs(c.CacheFile) {
		return bad("CacheFile %q must be an absolute path", c.CacheFile)
	}
	if err := c.GRPCBootstrap.Validate(); err != nil {
		return bad("%v", err)
	}
	if err := c.Wasm.Validate(); err != nil {
		return fmt.Errorf("%w: Wasm: %w", ErrBadConfig, err)
	}
	return nil
}

// serverName is the name checked in the control plane's certificate.
func (c Config) serverName() string {
	if c.ServerName != "" {
		return c.ServerName
	}
	host, _, err := net.SplitHostPort(c.DiscoveryAddress)
	if err != nil {
		return ""
	}
	// Istio: "For debugging on localhost (with port forward)".
	if strings.Contains(host, "localhost") {
		return "istiod.istio-system.svc"
	}
	return host
}
