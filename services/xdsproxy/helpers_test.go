package xdsproxy

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

func TestMain(m *testing.M) {
	// The proxyless gRPC client runs as a child process of this binary
	// (grpcclient_test.go): grpc-go's xDS client is process-wide.
	if os.Getenv(grpcClientEnv) != "" {
		os.Exit(runGRPCClient())
	}
	// A client under another uid (downstream_test.go).
	if os.Getenv(peerClientEnv) != "" {
		os.Exit(runPeerClient())
	}
	goleak.VerifyTestMain(m)
}

// waitCtx is a context bounded as the kit bounds its waits.
func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// testNode is the node id the test clients announce and the proxy caches for.
const testNode = "sidecar~127.0.0.1~test.default~default.svc.cluster.local"

// controlPlane starts an xDS server for the test.
func controlPlane(t *testing.T, opts xdsserver.Options) *xdsserver.Server {
	t.Helper()
	srv, err := xdsserver.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// servingControlPlane is a control plane serving snapshot v with n
// clusters, as most tests begin.
func servingControlPlane(t *testing.T, v string, n int) *xdsserver.Server {
	t.Helper()
	cp := controlPlane(t, xdsserver.Options{})
	snapshot(t, cp, v, n)
	return cp
}

// namesControlPlane is servingControlPlane(t, "v1", 3) serving a name
// table too (reviews.default.svc.cluster.local at ip), and the config of a
// proxy that takes it (NDS).
func namesControlPlane(t *testing.T, ip string) (*xdsserver.Server, Config) {
	t.Helper()
	cp := servingControlPlane(t, "v1", 3)
	if err := cp.SetNameTable(xdsserver.NameTable(map[string]string{"reviews.default.svc.cluster.local": ip})); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(tempRoot(t), cp.Addr())
	cfg.NDS = true
	return cp, cfg
}

// bothProtocols runs test once for each xDS protocol Envoy may speak:
// State of the World and Delta.
func bothProtocols(t *testing.T, test func(t *testing.T, delta bool)) {
	for _, delta := range []bool{false, true} {
		t.Run(protocolName(delta), func(t *testing.T) { test(t, delta) })
	}
}

// snapshot sets version v with n clusters and two listeners.
func snapshot(t *testing.T, srv *xdsserver.Server, v string, n int) {
	t.Helper()
	listeners := []types.Resource{
		xdsserver.Listener("0.0.0.0_80", "80", false, 80),
		xdsserver.Listener("0.0.0.0_8080", "8080", false, 8080),
	}
	if err := srv.SetSnapshot(v, xdsserver.Clusters(n, "svc-"+v+"-"), listeners, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
}

// proxy is a running XDS proxy.
type proxy struct {
	svc     *Service
	cfg     Config
	names   *testkit.Recorder[messages.NameTable]
	states  *testkit.Recorder[messages.XDSState]
	anchors *testkit.Recorder[messages.TrustAnchors]
	health  *testkit.Recorder[messages.Health]
	reg     *prometheus.Registry
	logs    *testkit.LogBuffer
	serving *testkit.Serving
}

// tempRoot is a short directory: unix socket paths are limited to 107
// bytes.
func tempRoot(t testing.TB) string { return testkit.ShortTempDir(t, "xds") }

// testConfig is a plaintext proxy for the control plane at addr, with
// its socket and cache under root.
func testConfig(root, addr string) Config {
	cfg := NewConfig(filepath.Join(root, "etc/istio/proxy/XDS"))
	cfg.OfflineCache = true
	cfg.TokenFile = filepath.Join(root, "var/run/secrets/tokens/istio-token")
	cfg.RootCAFile = filepath.Join(root, "var/run/secrets/istio/root-cert.pem")
	cfg.DiscoveryAddress = addr
	cfg.Plaintext = true
	cfg.NodeID = testNode
	cfg.CacheFile = filepath.Join(root, "etc/istio/proxy/xds-cache.pb")
	cfg.ReconnectBackoff = 5 * time.Millisecond
	cfg.ReconnectBackoffMax = 50 * time.Millisecond
	return cfg
}

type proxyOpts struct {
	in    Inputs
	clock messages.Clock
}

// stallProxy is a proxy to the control plane at addr that gives a
// stream up after a minute without an answer, a minute of clock: a manual
// clock the test advances. It has no offline cache, so that a stall shows
// as the end of Envoy's stream.
func stallProxy(t *testing.T, addr string) (*proxy, *testkit.ManualClock) {
	t.Helper()
	clock := testkit.NewManualClock()
	return uncachedProxy(t, addr, proxyOpts{clock: clock}, func(cfg *Config) { cfg.StallTimeout = time.Minute }), clock
}

// uncachedProxy is a proxy to the control plane at addr without an
// offline cache, so that an upstream gone shows as the end of Envoy's
// stream; edit, when given, changes the rest of its config first.
func uncachedProxy(t *testing.T, addr string, o proxyOpts, edit ...func(*Config)) *proxy {
	t.Helper()
	cfg := testConfig(tempRoot(t), addr)
	cfg.OfflineCache = false
	for _, e := range edit {
		e(&cfg)
	}
	return startProxy(t, cfg, o)
}

func startProxy(t *testing.T, cfg Config, o proxyOpts) *proxy {
	t.Helper()
	p := &proxy{
		cfg: cfg, names: &testkit.Recorder[messages.NameTable]{}, states: &testkit.Recorder[messages.XDSState]{},
		anchors: &testkit.Recorder[messages.TrustAnchors]{}, health: &testkit.Recorder[messages.Health]{},
		reg: prometheus.NewRegistry(), logs: testkit.NewLogBuffer(t),
	}
	rt := messages.NewRuntime(Name, p.health, o.clock, p.reg, p.logs.Logger())
	svc, err := New(cfg, o.in, Outputs{Names: p.names, State: p.states, Anchors: p.anchors}, rt)
	if err != nil {
		t.Fatal(err)
	}
	p.svc = svc
	p.start(t)
	return p
}

// start serves and waits until the socket accepts: it listens once the
// first state is out.
func (p *proxy) start(t *testing.T) {
	t.Helper()
	p.serving = testkit.Serve(t, p.svc)
	p.states.WaitFor(t, "the proxy to publish its state", func(v []messages.XDSState) bool { return len(v) > 0 })
}

func (p *proxy) stop(t *testing.T) {
	t.Helper()
	p.serving.Stop(t)
}

// client connects an Envoy-like client to the proxy; like Envoy, it
// reconnects when its stream ends.
func (p *proxy) client(t *testing.T, delta bool, types ...string) *xdsserver.Client {
	t.Helper()
	return p.clientWith(t, xdsserver.ClientOptions{Delta: delta, Types: types, Reconnect: true})
}

// clientWith connects a client with these options (target and node
// filled in).
func (p *proxy) clientWith(t *testing.T, o xdsserver.ClientOptions) *xdsserver.Client {
	t.Helper()
	o.Target = "unix://" + p.cfg.SocketPath
	if o.Node == nil {
		o.Node = &corev3.Node{Id: testNode, Cluster: "test"}
	}
	c, err := xdsserver.NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// metric reads a counter or gauge of the proxy's registry.
func (p *proxy) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return testkit.MetricValue(t, p.reg, name, labels...)
}

// waitState waits for an XDSState satisfying cond.
func (p *proxy) waitState(t *testing.T, what string, cond func(messages.XDSState) bool) messages.XDSState {
	t.Helper()
	return p.states.WaitLast(t, what, cond)
}

// waitHealth waits for a Health report satisfying cond.
func (p *proxy) waitHealth(t *testing.T, what string, cond func(messages.Health) bool) messages.Health {
	t.Helper()
	return p.health.WaitLast(t, what, cond)
}

// wantNothingServed: with the control plane away and no usable cache,
// Envoy's first stream ends Unavailable holding no cluster, and the
// upstream is down.
func (p *proxy) wantNothingServed(t *testing.T) {
	t.Helper()
	c := p.client(t, false)
	if err := c.WaitFor(waitCtx(t), endsWith(1, codes.Unavailable)); err != nil {
		t.Fatal(err)
	}
	if n := c.State().Counts[clusterType]; n != 0 {
		t.Errorf("the client got %d clusters, want none: no cache should have been read", n)
	}
	p.waitState(t, "down", func(s messages.XDSState) bool { return s.Upstream == messages.XDSDown })
}

// hasVersion is a client condition: typ is held at version v with n resources.
func hasVersion(typ, v string, n int) func(xdsserver.State) bool {
	return func(s xdsserver.State) bool { return s.Versions[typ] == v && s.Counts[typ] == n }
}

// clientAtV1 is a control plane at v1 (2 clusters, 2 listeners), a proxy
// to it, and an Envoy-like client on the protocol asked for that holds v1.
func clientAtV1(t *testing.T, delta bool) (*xdsserver.Server, *proxy, *xdsserver.Client) {
	t.Helper()
	cp := servingControlPlane(t, "v1", 2)
	p := startProxy(t, testConfig(tempRoot(t), cp.Addr()), proxyOpts{})
	c := p.client(t, delta)
	if err := c.WaitFor(waitCtx(t), hasVersion(clusterType, "v1", 2)); err != nil {
		t.Fatal(err)
	}
	return cp, p, c
}
