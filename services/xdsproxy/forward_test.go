package xdsproxy

import (
	"strings"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// An Envoy-like client gets the control plane's configuration through the
// proxy, in both protocols, and follows a new snapshot; the control plane
// sees its ACKs, and the proxy reports them.
func TestForwardsBothWays(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp := servingControlPlane(t, "v1", 3)
		p := startProxy(t, testConfig(tempRoot(t), cp.Addr()), proxyOpts{})
		p.waitHealth(t, "Ready before any Envoy", func(h messages.Health) bool { return h.State == messages.Ready })

		c := p.client(t, delta)
		ctx := waitCtx(t)
		if err := c.WaitFor(ctx, func(s xdsserver.State) bool {
			return hasVersion(resource.ClusterType, "v1", 3)(s) && hasVersion(resource.ListenerType, "v1", 2)(s)
		}); err != nil {
			t.Fatal(err)
		}
		if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool {
			return s.ACKs[resource.ClusterType] >= 1 && s.ACKs[resource.ListenerType] >= 1
		}); err != nil {
			t.Fatal(err)
		}

		snapshot(t, cp, "v2", 5)
		if err := c.WaitFor(ctx, hasVersion(resource.ClusterType, "v2", 5)); err != nil {
			t.Fatal(err)
		}
		names := c.Resources(resource.ClusterType)
		for n := range names {
			if !strings.Contains(n, "svc-v2-") {
				t.Errorf("client holds cluster %q from the old snapshot", n)
			}
		}
		st := p.waitState(t, "the ACK of v2 reported", func(s messages.XDSState) bool {
			return s.Upstream == messages.XDSConnected && s.LastACK[resource.ClusterType] == "v2"
		})
		if st.Address != cp.Addr() {
			t.Errorf("XDSState.Address = %q, want %q", st.Address, cp.Addr())
		}
		if got := p.metric(t, "xds_proxy_messages_total", "type_url", resource.ClusterType, "direction", "response"); got < 2 {
			t.Errorf("xds_proxy_messages_total{cds,response} = %v, want >= 2", got)
		}
		if got := p.metric(t, "xds_proxy_requests"); got < 4 {
			t.Errorf("xds_proxy_requests = %v, want >= 4", got)
		}
		// Istio's gauge of the largest request Envoy sent: the first,
		// with the node, is tens of bytes at least; a largest, not a sum
		// of the requests.
		if got := p.metric(t, "pilot_xds_recv_max"); got < 20 || got > maxRequestSize {
			t.Errorf("pilot_xds_recv_max = %v, want the largest request's size", got)
		}
		if got := c.State().Streams; got != 1 {
			t.Errorf("client opened %d streams, want 1", got)
		}
	})
}

func protocolName(delta bool) string {
	if delta {
		return "delta"
	}
	return "sotw"
}

// The tree restarts a service by calling Serve again on it: the socket
// comes back, and what the proxy learnt (its cache) is kept.
func TestServeAgain(t *testing.T) {
	cp := servingControlPlane(t, "v1", 3)
	cfg := testConfig(tempRoot(t), cp.Addr())
	cfg.CacheFile = "" // in memory only: what survives is the Service's own
	p := startProxy(t, cfg, proxyOpts{})
	recordV1(t, p, cp, false)
	p.stop(t)
	cp.Stop()
	p.start(t)
	servedFromCache(t, p, false)
}
