package xdsproxy

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/xdsproxy/protocol"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// noCacheNonceUpstream fails the test if the control plane received a
// response_nonce of the cache's: those answer responses it never sent.
func noCacheNonceUpstream(t *testing.T, cp *xdsserver.Server) {
	t.Helper()
	for typ, nonces := range cp.Stats().Nonces {
		for _, n := range nonces {
			if protocol.IsCacheNonce(n) {
				t.Errorf("the control plane received the cache's nonce %q for %s", n, typ)
			}
		}
	}
}

// ackedAfter is a control plane condition: clusters and listeners were
// ACKed more often than in before.
func ackedAfter(before xdsserver.Stats) func(xdsserver.Stats) bool {
	return func(s xdsserver.Stats) bool {
		return s.ACKs[resource.ClusterType] > before.ACKs[resource.ClusterType] &&
			s.ACKs[resource.ListenerType] > before.ACKs[resource.ListenerType]
	}
}

// When the control plane comes back while the cache serves Envoy, Envoy's
// stream moves to it, open (#24): the control plane sees the subscriptions
// Envoy made and the versions it holds, as on Envoy's own reconnection, the
// new configuration reaches Envoy's same stream, Envoy's ACKs reach the
// control plane with its nonces and none with the cache's, and the agent's
// own subscription (NDS) is made again on the new upstream.
func TestCachedStreamMovesToControlPlane(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp, cfg := namesControlPlane(t, "10.0.0.1")
		p := startProxy(t, cfg, proxyOpts{})
		// The name table comes on the stream recordV1 closes: its client
		// must stay until then.
		first := p.client(t, delta)
		p.names.WaitFor(t, "the first table", func(v []messages.NameTable) bool { return len(v) > 0 })
		first.Close()
		recordV1(t, p, cp, delta)

		cp.Stop()
		c := servedFromCache(t, p, delta)
		held := c.Resources(resource.ClusterType)
		// And to one route by name, while the cache serves it.
		if err := c.Subscribe(resource.RouteType, []string{"route-a"}); err != nil {
			t.Fatal(err)
		}
		snapshot(t, cp, "v2", 5)
		if err := cp.SetNameTable(xdsserver.NameTable(map[string]string{"ratings.default.svc.cluster.local": "10.0.0.2"})); err != nil {
			t.Fatal(err)
		}
		before := cp.Stats()
		if err := cp.Restart(); err != nil {
			t.Fatal(err)
		}
		continuesAfterCache(t, p, c, "v2", 5)
		ctx := waitCtx(t)
		if err := cp.WaitFor(ctx, ackedAfter(before)); err != nil {
			t.Fatal(err)
		}
		p.names.WaitLast(t, "the control plane's new table", func(nt messages.NameTable) bool {
			_, ok := nt.Hosts["ratings.default.svc.cluster.local"]
			return ok
		})
		noCacheNonceUpstream(t, cp)

		// The client subscribed to clusters and listeners by wildcard,
		// to routes by name.
		got := cp.Stats()
		for _, typ := range []string{resource.ClusterType, resource.ListenerType} {
			if names, ok := got.Subscribed[typ]; !ok || len(names) != 0 {
				t.Errorf("the control plane sees %s subscribed to %q (known: %v), want the wildcard", typ, names, ok)
			}
		}
		if names := got.Subscribed[resource.RouteType]; !slices.Equal(names, []string{"route-a"}) {
			t.Errorf("the control plane sees routes subscribed to %q, want [route-a]", names)
		}
		if delta {
			if !maps.Equal(got.Initial[resource.ClusterType], held) {
				t.Errorf("initial_resource_versions of clusters = %v, want what the client held: %v", got.Initial[resource.ClusterType], held)
			}
		} else {
			for _, typ := range []string{resource.ClusterType, resource.ListenerType} {
				if v := got.InitialVersion[typ]; v != "v1" {
					t.Errorf("version_info of the first %s request = %q, want the v1 the client held", typ, v)
				}
			}
		}
	})
}

// A resource removed while the control plane was down leaves Envoy when the
// stream moves to it: the proxy declares what the cache sent Envoy on this
// stream, which the control plane then removes (Delta).
func TestCachedStreamMoveRemovesWhatWentAway(t *testing.T) {
	cp, p := recordedV1(t, true)

	cp.Stop()
	c := servedFromCache(t, p, true) // a fresh Envoy: all it holds came from the cache
	// v2: one cluster of v1 stays, two go, one comes.
	kept := xdsserver.ClusterName("svc-v1-", 0)
	clusters := append(xdsserver.Clusters(1, "svc-v1-"), xdsserver.Cluster("new-cluster"))
	if err := cp.SetSnapshot("v2", clusters, []types.Resource{
		xdsserver.Listener("0.0.0.0_80", "80", false, 80), xdsserver.Listener("0.0.0.0_8080", "8080", false, 8080),
	}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := cp.Restart(); err != nil {
		t.Fatal(err)
	}
	ctx := waitCtx(t)
	if err := c.WaitFor(ctx, hasVersion(resource.ClusterType, "v2", 2)); err != nil {
		t.Fatal(err)
	}
	names := slices.Sorted(maps.Keys(c.Resources(resource.ClusterType)))
	if want := []string{"new-cluster", kept}; !slices.Equal(names, want) {
		t.Errorf("the client holds clusters %v, want %v", names, want)
	}
	if st := c.State(); st.Streams != 1 || len(st.Ends) != 0 {
		t.Errorf("the client opened %d streams, %d ended: want its one stream to carry on", st.Streams, len(st.Ends))
	}
	noCacheNonceUpstream(t, cp)
}

// Envoy's ACKs of the cache's responses, in flight as the stream moves to
// the control plane (the client reads them only after the move), stay in
// the proxy, and Envoy ends at the control plane's configuration.
func TestCachedStreamMoveKeepsCacheACKs(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp, p := recordedV1(t, delta)

		cp.Stop()
		c := p.client(t, delta)
		c.Pause()
		p.waitState(t, "serving the cache", func(s messages.XDSState) bool { return s.Upstream == messages.XDSServingCache })
		snapshot(t, cp, "v2", 5)
		before := cp.Stats()
		if err := cp.Restart(); err != nil {
			t.Fatal(err)
		}
		ctx := waitCtx(t)
		// The move is made once the control plane has the subscriptions
		// (and answers them: the client does not read yet).
		if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool {
			return len(s.Subscribed) == 2 && s.Requests[resource.ListenerType] > before.Requests[resource.ListenerType]
		}); err != nil {
			t.Fatal(err)
		}
		c.Resume()
		continuesAfterCache(t, p, c, "v2", 5)
		if err := cp.WaitFor(ctx, ackedAfter(before)); err != nil {
			t.Fatal(err)
		}
		if n := c.State().Responses[resource.ClusterType]; n < 2 {
			t.Errorf("the client read %d cluster responses, want the cache's and the control plane's", n)
		}
		if names := slices.Sorted(maps.Keys(c.Resources(resource.ClusterType))); len(names) != 5 || !strings.HasPrefix(names[0], "outbound|80||svc-v2-") {
			t.Errorf("the client holds clusters %v, want v2's 5", names)
		}
		noCacheNonceUpstream(t, cp)
	})
}

// A control plane that answers the probe and fails the stream Envoy's
// moves to (it is going away again) ends Envoy's stream, Unavailable, as
// before the move existed; Envoy's next stream is served from the cache,
// and moves once the control plane stays up. Nothing is left running
// (goleak, TestMain).
func TestCachedStreamEndsWhenControlPlaneFailsAgain(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp, p := recordedV1(t, delta)

		cp.Stop()
		c := servedFromCache(t, p, delta)
		snapshot(t, cp, "v2", 5)
		cp.RefuseAfter(1, status.Error(codes.Unavailable, "going away again"))
		if err := cp.Restart(); err != nil {
			t.Fatal(err)
		}
		ctx := waitCtx(t)
		if err := c.WaitFor(ctx, endsWith(1, codes.Unavailable)); err != nil {
			t.Fatal(err)
		}
		testkit.Contains(t, "end of the stream", status.Convert(c.State().Ends[0]).Message(), "failed as this stream moved to it", "going away again")
		if err := c.WaitFor(ctx, func(s xdsserver.State) bool { return s.Streams >= 2 }); err != nil {
			t.Fatal(err)
		}
		p.waitState(t, "serving the cache again", func(s messages.XDSState) bool { return s.Upstream == messages.XDSServingCache })

		cp.RefuseAfter(0, nil)
		if err := c.WaitFor(ctx, bothTypes("v2", 5)); err != nil {
			t.Fatal(err)
		}
		if n := len(c.State().Ends); n != 1 {
			t.Errorf("the client's stream ended %d times, want once (the failed move)", n)
		}
		noCacheNonceUpstream(t, cp)
	})
}
