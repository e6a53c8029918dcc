package xdsproxy

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// An Envoy that stops reading while the control plane pushes and while it
// keeps sending requests: nothing deadlocks (its requests are still read,
// istio/istio#39209), the proxy holds at most responseQueue+2 responses
// (the rest waits in gRPC flow control, that is, in the control plane),
// and once Envoy reads again it converges on the last push.
func TestSlowEnvoyNoDeadlockBoundedMemory(t *testing.T) {
	bothProtocols(t, func(t *testing.T, delta bool) {
		cp := servingControlPlane(t, "p0", 100)
		p := uncachedProxy(t, cp.Addr(), proxyOpts{})
		c := p.clientWith(t, xdsserver.ClientOptions{Delta: delta})
		ctx := waitCtx(t)
		if err := c.WaitFor(ctx, hasVersion(resource.ClusterType, "p0", 100)); err != nil {
			t.Fatal(err)
		}

		c.Pause()
		const pushes = 300
		pushed := make(chan error, 1)
		go func() {
			for i := 1; i <= pushes; i++ {
				v := fmt.Sprintf("p%d", i)
				if err := cp.SetSnapshot(v, xdsserver.Clusters(100, "svc-"+v+"-"), nil, nil, nil, nil); err != nil {
					pushed <- err
					return
				}
			}
			pushed <- nil
		}()
		// Far more request bytes than any flow-control window: if the
		// proxy stopped reading Envoy, these sends would block.
		names := make([]string, 100)
		for i := range names {
			names[i] = fmt.Sprintf("outbound|80||endpoint-%d.ns.svc.cluster.local", i)
		}
		sent := make(chan error, 1)
		go func() {
			for i := 0; i < 1000; i++ {
				if err := c.Subscribe(resource.EndpointType, names); err != nil {
					sent <- err
					return
				}
			}
			sent <- nil
		}()
		select {
		case err := <-sent:
			if err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("Envoy's requests are blocked while it does not read: deadlock")
		}

		c.Resume()
		if err := <-pushed; err != nil {
			t.Fatal(err)
		}
		if err := c.WaitFor(ctx, hasVersion(resource.ClusterType, fmt.Sprintf("p%d", pushes), 100)); err != nil {
			t.Fatal(err)
		}
		t.Logf("the proxy held up to %d responses at once", p.svc.maxInflight.Load())
		if got, bound := p.svc.maxInflight.Load(), int64(responseQueue+2); got > bound || got < 1 {
			t.Errorf("the proxy held up to %d responses at once, want 1..%d", got, bound)
		}
		if got := c.State().Streams; got != 1 {
			t.Errorf("the client needed %d streams, want 1", got)
		}
	})
}

// silentControlPlane accepts ADS streams, reads them, and never answers.
type silentControlPlane struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	requests atomic.Int64
	got      chan struct{} // gets a token per request
}

func (s *silentControlPlane) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for {
		if _, err := st.Recv(); err != nil {
			return err
		}
		s.requests.Add(1)
		select {
		case s.got <- struct{}{}:
		default:
		}
	}
}

func startSilent(t *testing.T) (*silentControlPlane, string) {
	t.Helper()
	s := &silentControlPlane{got: make(chan struct{}, 1)}
	return s, startADS(t, s)
}

// startADS serves cp on a loopback port and returns its address.
func startADS(t *testing.T, cp discoveryv3.AggregatedDiscoveryServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveADS(t, lis, cp)
	return lis.Addr().String()
}

// serveSilent serves a silent control plane on lis until the test ends.
func serveSilent(t *testing.T, lis net.Listener) *silentControlPlane {
	t.Helper()
	s := &silentControlPlane{got: make(chan struct{}, 1)}
	serveADS(t, lis, s)
	return s
}

// serveADS serves cp on lis until the test ends.
func serveADS(t *testing.T, lis net.Listener, cp discoveryv3.AggregatedDiscoveryServiceServer) {
	t.Helper()
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, cp)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); <-done })
}

// deafControlPlane accepts a stream and never reads it.
type deafControlPlane struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
}

func (deafControlPlane) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	<-st.Context().Done()
	return nil
}

// Envoy's requests wait for a control plane that does not read them in a
// queue that never blocks the proxy's reader (istio/istio#39209) and never
// drops one (a lost ACK or subscription would leave Envoy and the control
// plane out of step); past requestQueue the stream ends with
// ResourceExhausted instead, and Envoy reconnects to restate them (#26:
// the queue grew without bound).
func TestRequestQueueBoundEndsStream(t *testing.T) {
	p, _ := stallProxy(t, startADS(t, deafControlPlane{}))
	st := openADS(t, p.cfg.SocketPath)
	// Large requests, so that gRPC's flow-control windows toward the
	// control plane fill after a few hundred and the rest wait in the
	// proxy.
	req := &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: testNode}, TypeUrl: resource.EndpointType,
		ResourceNames: []string{strings.Repeat("x", 4<<10)}}
	const most = 20 * requestQueue
	sent := 0
	for ; sent < most; sent++ {
		if err := st.Send(req); err != nil {
			break
		}
	}
	if sent == most {
		t.Fatalf("the stream is still open after %d requests the control plane did not read", most)
	}
	_, err := st.Recv()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("stream ended with %v after %d requests, want ResourceExhausted", err, sent)
	}
	testkit.Contains(t, "end status", status.Convert(err).Message(), "requests wait for the control plane")
	testkit.Contains(t, "logs", p.logs.String(), "too many requests wait for the control plane")
}

// A control plane that keeps the stream open and answers nothing
// (istio/istio#57064) is given up after StallTimeout: Envoy's stream ends
// with Unavailable and Envoy reconnects; it is counted and reported.
func TestStalledControlPlaneEndsStream(t *testing.T) {
	silent, addr := startSilent(t)
	p, clock := stallProxy(t, addr)
	c := p.clientWith(t, xdsserver.ClientOptions{})
	select {
	case <-silent.got:
	case <-time.After(testkit.Timeout):
		t.Fatal("the request never reached the control plane")
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		_ = c.WaitFor(waitCtx(t), func(s xdsserver.State) bool { return len(s.Ends) > 0 })
	}()
	if !clock.AdvanceUntil(t, p.cfg.StallTimeout/4, 20, ended) {
		t.Fatal("the stream did not end")
	}
	end := c.State().Ends[0]
	if status.Code(end) != codes.Unavailable {
		t.Errorf("stream ended with %v, want Unavailable", end)
	}
	testkit.Contains(t, "end status", status.Convert(end).Message(), "control plane stalled", "57064")
	if got := p.metric(t, "xds_proxy_stalled_streams_total"); got != 1 {
		t.Errorf("xds_proxy_stalled_streams_total = %v, want 1", got)
	}
	st := p.waitState(t, "down", func(s messages.XDSState) bool { return s.Upstream == messages.XDSDown })
	testkit.Contains(t, "LastError", st.LastError, "stalled")
}

// A control plane that answered is never cut, however long it is quiet:
// ACKs expect no answer.
func TestQuietControlPlaneIsNotStalled(t *testing.T) {
	cp := servingControlPlane(t, "v1", 2)
	p, clock := stallProxy(t, cp.Addr())
	c := p.client(t, false)
	if err := c.WaitFor(waitCtx(t), func(s xdsserver.State) bool {
		return hasVersion(resource.ClusterType, "v1", 2)(s) && hasVersion(resource.ListenerType, "v1", 2)(s)
	}); err != nil {
		t.Fatal(err)
	}
	// Quiet means nothing in flight either: the answers are in and Envoy's
	// ACKs have reached the control plane (else the manual clock, racing
	// ahead, would find a request legitimately waiting).
	if err := cp.WaitFor(waitCtx(t), func(s xdsserver.Stats) bool {
		return s.ACKs[resource.ClusterType] > 0 && s.ACKs[resource.ListenerType] > 0
	}); err != nil {
		t.Fatal(err)
	}
	never := make(chan struct{})
	clock.AdvanceUntil(t, p.cfg.StallTimeout/4, 40, never) // ten stall timeouts
	if st := c.State(); len(st.Ends) != 0 || st.Streams != 1 {
		t.Errorf("a quiet control plane was cut: %d streams, ends %v", st.Streams, st.Ends)
	}
}

// A newer stream replaces the older, which ends with an OK status (as in
// Istio: one Envoy stream at a time).
func TestNewerStreamReplacesOlder(t *testing.T) {
	cp := servingControlPlane(t, "v1", 2)
	p := startProxy(t, testConfig(tempRoot(t), cp.Addr()), proxyOpts{})
	ctx := waitCtx(t)
	old := p.clientWith(t, xdsserver.ClientOptions{})
	if err := old.WaitFor(ctx, hasVersion(resource.ClusterType, "v1", 2)); err != nil {
		t.Fatal(err)
	}
	newer := p.clientWith(t, xdsserver.ClientOptions{Delta: true})
	if err := newer.WaitFor(ctx, hasVersion(resource.ClusterType, "v1", 2)); err != nil {
		t.Fatal(err)
	}
	if err := old.WaitFor(ctx, func(s xdsserver.State) bool { return len(s.Ends) == 1 }); err != nil {
		t.Fatal(err)
	}
	if end := old.State().Ends[0]; end != io.EOF {
		t.Errorf("the older stream ended with %v, want an OK status (io.EOF)", end)
	}
	snapshot(t, cp, "v2", 3)
	if err := newer.WaitFor(ctx, hasVersion(resource.ClusterType, "v2", 3)); err != nil {
		t.Fatal(err)
	}
	testkit.Contains(t, "logs", p.logs.String(), "a newer Envoy stream replaces the open one")
}

// An Envoy that does not read is not a stalled control plane: the control
// plane answered, its answers wait for Envoy, and the stream is kept.
func TestSlowEnvoyIsNotAStall(t *testing.T) {
	cp := servingControlPlane(t, "p0", 100)
	p, clock := stallProxy(t, cp.Addr())
	c := p.clientWith(t, xdsserver.ClientOptions{})
	ctx := waitCtx(t)
	if err := c.WaitFor(ctx, hasVersion(resource.ClusterType, "p0", 100)); err != nil {
		t.Fatal(err)
	}
	c.Pause()
	for i := 1; i <= 50; i++ {
		v := fmt.Sprintf("p%d", i)
		if err := cp.SetSnapshot(v, xdsserver.Clusters(100, "svc-"+v+"-"), nil, nil, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	// A new type: a request the control plane must answer, and cannot
	// while Envoy does not read.
	if err := c.Subscribe(resource.RouteType, []string{"80"}); err != nil {
		t.Fatal(err)
	}
	// The fake clock must not run while the request is on its way: ten
	// minutes of it pass in a few milliseconds, and a Send caught in
	// flight would look a minute long (under load, make test saw it).
	if err := cp.WaitFor(ctx, func(s xdsserver.Stats) bool { return s.Requests[resource.RouteType] > 0 }); err != nil {
		t.Fatal(err)
	}
	never := make(chan struct{})
	clock.AdvanceUntil(t, p.cfg.StallTimeout/4, 40, never)
	if got := p.metric(t, "xds_proxy_stalled_streams_total"); got != 0 {
		t.Errorf("a slow Envoy was taken for a stalled control plane (%v)", got)
	}
	c.Resume()
	if err := c.WaitFor(ctx, hasVersion(resource.ClusterType, "p50", 100)); err != nil {
		t.Fatal(err)
	}
	if got := c.State().Streams; got != 1 {
		t.Errorf("the client needed %d streams, want 1", got)
	}
}
