package xdsproxy

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

func TestMain(m *testing.M) {
	// The proxyless gRPC client runs as a child process of this binary
	// (grpcclient_test.go): grpc-go's xDS client is process-wide.
	if os.Getenv(grpcClientEnv) != "" {
		os.Exit(runGRPCClient())
	}
	goleak.VerifyTestMain(m)
}

// testTimeout bounds every wait of a test; it is a deadlock detector,
// never a performance threshold.
const testTimeout = 30 * time.Second

func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// testNode is the node id the test clients announce and the proxy caches for.
const testNode = "sidecar~127.0.0.1~test.default~default.svc.cluster.local"

// syncBuffer collects logs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// recorder is a sink that keeps every value, in order.
type recorder[T any] struct {
	mu      sync.Mutex
	values  []T
	changed chan struct{}
}

func newRecorder[T any]() *recorder[T] { return &recorder[T]{changed: make(chan struct{})} }

func (r *recorder[T]) Send(v T) {
	r.mu.Lock()
	r.values = append(r.values, v)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (r *recorder[T]) all() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.values...)
}

func (r *recorder[T]) last() (T, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var zero T
	if len(r.values) == 0 {
		return zero, false
	}
	return r.values[len(r.values)-1], true
}

// waitFor waits until cond holds for the values so far.
func (r *recorder[T]) waitFor(t *testing.T, what string, cond func([]T) bool) []T {
	t.Helper()
	deadline := time.After(testTimeout)
	for {
		r.mu.Lock()
		vals, changed := append([]T(nil), r.values...), r.changed
		r.mu.Unlock()
		if cond(vals) {
			return vals
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("waiting for %s; got %d values, last %+v", what, len(vals), lastOf(vals))
		}
	}
}

// reached waits, without failing the test (it may run on another
// goroutine), until cond holds (true) or stop is closed (false).
func (r *recorder[T]) reached(cond func([]T) bool, stop <-chan struct{}) bool {
	for {
		r.mu.Lock()
		vals, changed := append([]T(nil), r.values...), r.changed
		r.mu.Unlock()
		if cond(vals) {
			return true
		}
		select {
		case <-changed:
		case <-stop:
			return false
		}
	}
}

func lastOf[T any](v []T) any {
	if len(v) == 0 {
		return nil
	}
	return v[len(v)-1]
}

// manualClock is a clock that moves only when told to.
type manualClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []clockWaiter
	added   chan struct{} // closed and replaced when a waiter is added
}

type clockWaiter struct {
	at time.Time
	ch chan time.Time
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), added: make(chan struct{})}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, clockWaiter{at: c.now.Add(d), ch: ch})
	close(c.added)
	c.added = make(chan struct{})
	return ch
}

// advance moves the clock and fires the waiters that are due.
func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
}

// pending returns how many waiters wait, and a channel closed when the
// next one is added.
func (c *manualClock) pending() (int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters), c.added
}

// advanceUntil advances the clock by step each time something waits on
// it, until done is closed (it returns true) or after max steps (false).
func (c *manualClock) advanceUntil(t *testing.T, step time.Duration, max int, done <-chan struct{}) bool {
	t.Helper()
	deadline := time.After(testTimeout)
	for i := 0; i < max; i++ {
		for {
			n, added := c.pending()
			if n > 0 {
				break
			}
			select {
			case <-added:
			case <-done:
				return true
			case <-deadline:
				t.Fatal("nothing waits on the clock")
			}
		}
		select {
		case <-done:
			return true
		default:
		}
		c.advance(step)
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

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
	names   *recorder[messages.NameTable]
	states  *recorder[messages.XDSState]
	anchors *recorder[messages.TrustAnchors]
	health  *recorder[messages.Health]
	reg     *prometheus.Registry
	logs    *syncBuffer
	cancel  context.CancelFunc
	done    chan error
}

// tempRoot is a short directory: unix socket paths are limited to 107
// bytes, and t.TempDir's can be longer.
func tempRoot(t *testing.T) string {
	t.Helper()
	root, err := makeTempRoot()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeAll(root) })
	return root
}

func makeTempRoot() (string, error) { return os.MkdirTemp("", "xds") }

func removeAll(dir string) { _ = os.RemoveAll(dir) }

// testConfig is a plaintext proxy for the control plane at addr, with
// its socket and cache under root.
func testConfig(root, addr string) Config {
	cfg := NewConfig(filepath.Join(root, "etc/istio/proxy/XDS"))
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

func startProxy(t *testing.T, cfg Config, o proxyOpts) *proxy {
	t.Helper()
	p := &proxy{
		cfg: cfg, names: newRecorder[messages.NameTable](), states: newRecorder[messages.XDSState](),
		anchors: newRecorder[messages.TrustAnchors](), health: newRecorder[messages.Health](),
		reg: prometheus.NewRegistry(), logs: &syncBuffer{},
	}
	log := slog.New(slog.NewTextHandler(p.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rt := messages.NewRuntime(Name, p.health, o.clock, p.reg, log)
	svc, err := New(cfg, o.in, Outputs{Names: p.names, State: p.states, Anchors: p.anchors}, rt)
	if err != nil {
		t.Fatal(err)
	}
	p.svc = svc
	p.start(t)
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("proxy logs:\n%s", p.logs.String())
		}
	})
	return p
}

// start serves and waits until the socket accepts.
func (p *proxy) start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.done = cancel, make(chan error, 1)
	go func() { p.done <- p.svc.Serve(ctx) }()
	p.states.waitFor(t, "the proxy to publish its state", func(v []messages.XDSState) bool { return len(v) > 0 })
}

func (p *proxy) stop(t *testing.T) {
	t.Helper()
	if p.cancel == nil {
		return
	}
	p.cancel()
	p.cancel = nil
	select {
	case err := <-p.done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Serve returned %v, want context.Canceled", err)
		}
	case <-time.After(testTimeout):
		t.Error("Serve did not return after cancel")
	}
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
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// waitState waits for an XDSState satisfying cond.
func (p *proxy) waitState(t *testing.T, what string, cond func(messages.XDSState) bool) messages.XDSState {
	t.Helper()
	v := p.states.waitFor(t, what, func(v []messages.XDSState) bool { return len(v) > 0 && cond(v[len(v)-1]) })
	return v[len(v)-1]
}

// waitHealth waits for a Health report satisfying cond.
func (p *proxy) waitHealth(t *testing.T, what string, cond func(messages.Health) bool) messages.Health {
	t.Helper()
	v := p.health.waitFor(t, what, func(v []messages.Health) bool { return len(v) > 0 && cond(v[len(v)-1]) })
	return v[len(v)-1]
}

// hasVersion is a client condition: typ is held at version v with n resources.
func hasVersion(typ, v string, n int) func(xdsserver.State) bool {
	return func(s xdsserver.State) bool { return s.Versions[typ] == v && s.Counts[typ] == n }
}

func mustContain(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("%s: %q does not contain %q", what, got, w)
		}
	}
}
