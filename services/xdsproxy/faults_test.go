package xdsproxy

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/xdsproxy/lkg"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// bothTypes is a client condition: clusters and listeners at version v.
func bothTypes(v string, clusters int) func(xdsserver.State) bool {
	return func(s xdsserver.State) bool {
		return hasVersion(resource.ClusterType, v, clusters)(s) && hasVersion(resource.ListenerType, v, 2)(s)
	}
}

// endsWith is a client condition: its stream ended at least n times, the
// last time with code.
func endsWith(n int, code codes.Code) func(xdsserver.State) bool {
	return func(s xdsserver.State) bool {
		return len(s.Ends) >= n && status.Code(s.Ends[len(s.Ends)-1]) == code
	}
}

// Istio's behaviour without a cache: a control plane that dies ends
// Envoy's stream; Envoy reconnects when it is back and gets what changed
// meanwhile.
func TestControlPlaneOutageEndsStream(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp := servingControlPlane(t, "v1", 3)
		p := uncachedProxy(t, cp.Addr(), proxyOpts{})
		c := p.client(t, delta)
		ctx := waitCtx(t)
		if err := c.WaitFor(ctx, bothTypes("v1", 3)); err != nil {
			t.Fatal(err)
		}

		cp.Stop()
		if err := c.WaitFor(ctx, endsWith(1, codes.Unavailable)); err != nil {
			t.Fatal(err)
		}
		p.waitState(t, "down", func(s messages.XDSState) bool { return s.Upstream == messages.XDSDown && s.LastError != "" })
		snapshot(t, cp, "v2", 4)
		if err := cp.Restart(); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitFor(ctx, bothTypes("v2", 4)); err != nil {
			t.Fatal(err)
		}
		p.waitState(t, "connected again", func(s messages.XDSState) bool { return s.Upstream == messages.XDSConnected })
		p.waitHealth(t, "Ready again", func(h messages.Health) bool { return h.State == messages.Ready })
	})
}

// cachedV1 is a control plane serving v1, and the configuration of a
// proxy that has written v1 to its cache file and stopped.
func cachedV1(t *testing.T, delta bool) (*xdsserver.Server, Config) {
	t.Helper()
	cp, p := recordedV1(t, delta)
	p.stop(t)
	return cp, p.cfg
}

// recordedV1 is a control plane serving v1 and a proxy to it that has
// cached v1 (recordV1).
func recordedV1(t *testing.T, delta bool) (*xdsserver.Server, *proxy) {
	t.Helper()
	cp := servingControlPlane(t, "v1", 3)
	p := startProxy(t, testConfig(tempRoot(t), cp.Addr()), proxyOpts{})
	recordV1(t, p, cp, delta)
	return cp, p
}

// stoppedCacheOfV1 is a proxy's config whose cache file holds v1, and the
// file's bytes; the control plane is stopped, so a proxy started with cfg
// has only the cache: what a test spoils to see a bad file refused.
func stoppedCacheOfV1(t *testing.T) (Config, []byte) {
	t.Helper()
	cp, cfg := cachedV1(t, false)
	good, err := os.ReadFile(cfg.CacheFile)
	if err != nil {
		t.Fatal(err)
	}
	cp.Stop()
	return cfg, good
}

// recordV1 runs a client through the proxy until the control plane has
// its ACKs of v1 (3 clusters, 2 listeners), so that the proxy cached them.
func recordV1(t *testing.T, p *proxy, cp *xdsserver.Server, delta bool) {
	t.Helper()
	ctx := waitCtx(t)
	before := cp.Stats()
	c := p.client(t, delta)
	if err := c.WaitFor(ctx, bothTypes("v1", 3)); err != nil {
		t.Fatal(err)
	}
	// The proxy records an ACK before it forwards it.
	if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool {
		return s.ACKs[resource.ClusterType] > before.ACKs[resource.ClusterType] &&
			s.ACKs[resource.ListenerType] > before.ACKs[resource.ListenerType]
	}); err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// continuesAfterCache: the stream p served c from its cache moves to the
// control plane, open (#24), and gets version's clusters and listeners;
// p says connected.
func continuesAfterCache(t *testing.T, p *proxy, c *xdsserver.Client, version string, clusters int) {
	t.Helper()
	if err := c.WaitFor(waitCtx(t), bothTypes(version, clusters)); err != nil {
		t.Fatal(err)
	}
	if st := c.State(); st.Streams != 1 || len(st.Ends) != 0 {
		t.Errorf("the client opened %d streams, %d ended (%v): want its one stream to carry on", st.Streams, len(st.Ends), st.Ends)
	}
	p.waitState(t, "connected", func(s messages.XDSState) bool { return s.Upstream == messages.XDSConnected })
}

// servedFromCache checks that a fresh client gets v1 from the proxy, with
// the proxy's own nonces, while the control plane is down.
func servedFromCache(t *testing.T, p *proxy, delta bool) *xdsserver.Client {
	t.Helper()
	c := p.client(t, delta)
	if err := c.WaitFor(waitCtx(t), bothTypes("v1", 3)); err != nil {
		t.Fatal(err)
	}
	for typ, nonce := range c.State().Nonces {
		if !strings.HasPrefix(nonce, "meshagent-cache-") {
			t.Errorf("%s came with nonce %q, not one of the cache's", typ, nonce)
		}
	}
	return c
}

// The last-known-good configuration: a fresh Envoy that connects while the
// control plane is down gets what the last one acknowledged; the proxy
// says it serves the cache; when the control plane is back the stream
// moves to it and Envoy converges on the new configuration.
func TestOfflineCacheServesAndResynchronises(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp, p := recordedV1(t, delta)

		cp.Stop()
		c := servedFromCache(t, p, delta)
		st := p.waitState(t, "serving the cache", func(s messages.XDSState) bool { return s.Upstream == messages.XDSServingCache })
		if st.Since.IsZero() || st.LastError == "" {
			t.Errorf("XDSState %+v: want since and the last error", st)
		}
		// What the cache sent counts its resources (#33: /debug/tree said
		// "cds (0 resources)" from then on while Envoy held them all).
		if n := st.Types[resource.ClusterType].SentResources; n != 3 {
			t.Errorf("CDS served from the cache: %d resources sent, want 3", n)
		}
		h := p.waitHealth(t, "Degraded", func(h messages.Health) bool { return h.State == messages.Degraded })
		testkit.Contains(t, "health reason", h.Reason, "serving cached configuration", "unreachable since", cp.Addr())
		if got := p.metric(t, "xds_proxy_serving_cache"); got != 1 {
			t.Errorf("xds_proxy_serving_cache = %v, want 1", got)
		}
		if got := p.metric(t, "xds_proxy_messages_total", "type_url", resource.ClusterType, "direction", "cache"); got < 1 {
			t.Errorf("no CDS response counted as served from the cache")
		}
		testkit.Contains(t, "logs", p.logs.String(), "serving cached configuration to Envoy")

		snapshot(t, cp, "v2", 5)
		if err := cp.Restart(); err != nil {
			t.Fatal(err)
		}
		continuesAfterCache(t, p, c, "v2", 5)
		p.waitHealth(t, "Ready", func(h messages.Health) bool { return h.State == messages.Ready })
		if got := p.metric(t, "xds_proxy_serving_cache"); got != 0 {
			t.Errorf("xds_proxy_serving_cache = %v after the control plane came back", got)
		}
	})
}

// The cache file lets a restarted agent (a new Service, same file) serve
// Envoy during an outage.
func TestCacheFileSurvivesRestart(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp, cfg := cachedV1(t, delta)
		fi, err := os.Stat(cfg.CacheFile)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("cache file mode %v, want 0600", fi.Mode().Perm())
		}

		cp.Stop()
		p2 := startProxy(t, cfg, proxyOpts{})
		servedFromCache(t, p2, delta)
		testkit.Contains(t, "logs", p2.logs.String(), "loaded the cached xDS configuration")
	})
}

// A cache file that is corrupt, truncated, or written for another node or
// control plane is ignored with a warning and removed, never served.
func TestBadCacheFileIgnored(t *testing.T) {
	cfg, good := stoppedCacheOfV1(t)
	_, snap, err := lkg.ReadFile(cfg.CacheFile, cfg.NodeID, cfg.DiscoveryAddress, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"corrupt", flipByte(good, len(good)/2), "checksum mismatch"},
		{"truncated", good[:len(good)-40], "checksum mismatch"},
		{"empty", nil, "bad magic"},
		{"other node", cacheImage(lkg.Header{NodeID: "sidecar~10.9.9.9~other.default~default.svc.cluster.local", Address: cfg.DiscoveryAddress}, snap), "written for node"},
		{"other control plane", cacheImage(lkg.Header{NodeID: cfg.NodeID, Address: "istiod.elsewhere:15012"}, snap), "written for control plane"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(cfg.CacheFile, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			p := startProxy(t, cfg, proxyOpts{})
			testkit.Contains(t, "logs", p.logs.String(), "ignoring the xDS cache file", tc.want)
			if _, err := os.Stat(cfg.CacheFile); !os.IsNotExist(err) {
				t.Errorf("the unusable cache file is still there (%v)", err)
			}
			p.wantNothingServed(t)
		})
	}
}

// cacheImage is the cache file lkg.Write writes for h and snap.
func cacheImage(h lkg.Header, snap lkg.Snapshot) []byte {
	var buf bytes.Buffer
	_ = lkg.Write(&buf, h, snap)
	return buf.Bytes()
}

func flipByte(b []byte, i int) []byte {
	out := append([]byte(nil), b...)
	out[i] ^= 0x5a
	return out
}

// Delta: the cached set follows what Envoy acknowledged, removals
// included, across streams.
func TestDeltaCacheAppliesRemovals(t *testing.T) {
	cp := servingControlPlane(t, "v1", 3)
	p := startProxy(t, testConfig(tempRoot(t), cp.Addr()), proxyOpts{})
	ctx := waitCtx(t)
	c := p.client(t, true)
	if err := c.WaitFor(ctx, bothTypes("v1", 3)); err != nil {
		t.Fatal(err)
	}
	// v2: one cluster of v1 stays, two go, one comes.
	clusters := xdsserver.Clusters(1, "svc-v1-")
	clusters = append(clusters, xdsserver.Cluster("new-cluster"))
	if err := cp.SetSnapshot("v2", clusters, []types.Resource{
		xdsserver.Listener("0.0.0.0_80", "80", false, 80), xdsserver.Listener("0.0.0.0_8080", "8080", false, 8080),
	}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitFor(ctx, hasVersion(resource.ClusterType, "v2", 2)); err != nil {
		t.Fatal(err)
	}
	want := c.Resources(resource.ClusterType)
	if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return s.ACKs[resource.ClusterType] >= 2 }); err != nil {
		t.Fatal(err)
	}
	c.Close()
	cp.Stop()

	fresh := p.client(t, true)
	if err := fresh.WaitFor(ctx, hasVersion(resource.ClusterType, "v2", 2)); err != nil {
		t.Fatal(err)
	}
	got := fresh.Resources(resource.ClusterType)
	for name, v := range want {
		if got[name] != v {
			t.Errorf("cached cluster %q at version %q, want %q (cache %v)", name, got[name], v, got)
		}
	}
}

// A control plane that accepts the stream and never answers is, for a
// fresh Envoy, as good as unreachable: after StallTimeout the cache
// serves it.
func TestStalledControlPlaneServesCache(t *testing.T) {
	cp := servingControlPlane(t, "v1", 3)
	clock := testkit.NewManualClock()
	cfg := testConfig(tempRoot(t), cp.Addr())
	cfg.StallTimeout = time.Minute
	p := startProxy(t, cfg, proxyOpts{clock: clock})
	recordV1(t, p, cp, true)

	cp.Hang(true)
	if err := cp.Restart(); err != nil {
		t.Fatal(err)
	}
	c := p.client(t, true)
	ctx := waitCtx(t)
	if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return s.Hung > 0 }); err != nil {
		t.Fatal(err)
	}
	// Step the clock until the watchdog gives up and the cache serves
	// (then the clock stops: the retries would keep it busy).
	serving := make(chan struct{})
	go func() {
		if p.states.Reached(func(v []messages.XDSState) bool {
			return len(v) > 0 && v[len(v)-1].Upstream == messages.XDSServingCache
		}, ctx.Done()) {
			close(serving)
		}
	}()
	if !clock.AdvanceUntil(t, cfg.StallTimeout/4, 20, serving) {
		t.Fatal("the stalled stream did not end")
	}
	if err := c.WaitFor(ctx, bothTypes("v1", 3)); err != nil {
		t.Fatal(err)
	}
	testkit.Contains(t, "logs", p.logs.String(), "ending a stalled stream", "serving cached configuration to Envoy")
	if got := p.metric(t, "xds_proxy_stalled_streams_total"); got != 1 {
		t.Errorf("xds_proxy_stalled_streams_total = %v, want 1", got)
	}
}

// While the cache is served the control plane is probed at the base pace
// for the first seconds of an outage (a restarting istiod is back within
// them), then with a doubling delay up to the maximum.
func TestProbePace(t *testing.T) {
	cfg := Config{ReconnectBackoff: 500 * time.Millisecond, ReconnectBackoffMax: 30 * time.Second}
	delay, elapsed := cfg.ReconnectBackoff, time.Duration(0)
	var delays []time.Duration
	for elapsed < 2*time.Minute {
		elapsed += delay
		delays = append(delays, delay)
		delay = cfg.nextProbeDelay(delay, elapsed)
	}
	for i, d := range delays {
		at := time.Duration(0)
		for _, p := range delays[:i] {
			at += p
		}
		switch {
		case at < steadyProbing && d != cfg.ReconnectBackoff:
			t.Fatalf("probe %d, %v into the outage, waited %v: want the base %v (delays %v)", i, at, d, cfg.ReconnectBackoff, delays)
		case d > cfg.ReconnectBackoffMax:
			t.Fatalf("probe %d waited %v, more than the maximum (delays %v)", i, d, delays)
		}
	}
	if got := delays[len(delays)-1]; got != cfg.ReconnectBackoffMax {
		t.Fatalf("after two minutes the delay is %v, want the maximum %v (delays %v)", got, cfg.ReconnectBackoffMax, delays)
	}
}

// While the control plane's port refuses connections, within the first
// seconds of an outage, the next probe comes at a fifth of the delay: a
// refused connect costs the control plane nothing, and a restarted istiod
// is found about 50 ms after it listens instead of 250 on average (#24). A
// probe that connected and failed, or one late in the outage, waits the
// whole delay.
func TestProbeWaitAfterRefused(t *testing.T) {
	const delay = 500 * time.Millisecond
	refused := status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:15012: connect: connection refused"`)
	answeredNothing := fmt.Errorf("%w within 2m0s", errNoAnswer)
	tlsFailed := status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: x509: certificate signed by unknown authority"`)
	for _, c := range []struct {
		name        string
		unreachable time.Duration
		err         error
		want        time.Duration
	}{
		{"refused, early in the outage", time.Second, refused, delay / refusedPace},
		{"refused, first failure", 0, refused, delay / refusedPace},
		{"refused, past the steady probing", steadyProbing, refused, delay},
		{"connected, no answer", time.Second, answeredNothing, delay},
		{"connected, TLS refused", time.Second, tlsFailed, delay},
	} {
		if got := probeWait(delay, c.unreachable, c.err); got != c.want {
			t.Errorf("%s: waits %v, want %v", c.name, got, c.want)
		}
	}
}
