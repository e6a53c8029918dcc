package protocol

import (
	"log/slog"
	"runtime"
	"testing"
	"weak"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/meshagent/meshagent/services/xdsproxy/lkg"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// What Envoy acknowledged is kept as the pieces received, not a copy.
func TestLastKnownGoodHoldsTheReceivedBytes(t *testing.T) {
	f := &rawxds.Frame{Body: xdsserver.Pieces(xdsserver.SotWResponse(t, "v1", "n1", 100), 1000)}
	if err := f.Scan(); err != nil {
		t.Fatal(err)
	}
	c := lkg.New(1<<30, slog.New(slog.DiscardHandler))
	x := SotW{}.NewTracker(1)
	x.Sending(f, c)
	x.Observe(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v1", ResponseNonce: "n1"}, true, c)
	e, ok := c.SotW(resource.ClusterType)
	if !ok || len(e.Response) != len(f.Body) {
		t.Fatalf("cached %v: %d pieces, want %d", ok, len(e.Response), len(f.Body))
	}
	for i := range e.Response {
		if &e.Response[i][0] != &f.Body[i][0] {
			t.Fatalf("piece %d is a copy", i)
		}
	}
	// A reply from the cache shares them too: only the new nonce is new.
	served := x.Replay(c)
	if len(served) != 1 || &served[0].Body[0][0] != &f.Body[0][0] || len(served[0].Body) != len(f.Body)+1 {
		t.Fatalf("served %d frames", len(served))
	}
}

// A Delta response Envoy acknowledged is no longer held by the stream: the
// cache keeps its resources, and the frame (with every piece of the
// response) goes (#24: the pending list's array kept it until the next).
func TestAcknowledgedDeltaFrameIsReleased(t *testing.T) {
	c := lkg.New(1<<30, slog.New(slog.DiscardHandler))
	x := Delta{}.NewTracker(1)
	x.Observe(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType}, true, c)
	f := &rawxds.Frame{Body: xdsserver.Pieces(rawxds.DeltaResponse(resource.ClusterType, "1", "n1", [][]byte{xdsserver.DeltaResource(t, "a", "a1", nil)}), 100)}
	if err := f.Scan(); err != nil {
		t.Fatal(err)
	}
	x.Sending(f, c)
	held := weak.Make(f)
	f = nil
	x.Observe(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: "n1"}, true, c)
	if _, _, ok := c.Delta(resource.ClusterType); !ok {
		t.Fatal("the acknowledged response is not cached")
	}
	runtime.GC()
	if held.Value() != nil {
		t.Error("the stream still holds the acknowledged frame")
	}
	runtime.KeepAlive(x)
}

// A stream that moves declares, per type, the version Envoy will hold when
// the control plane's first answer reaches it: the last response sent to
// Envoy on the stream while it is in flight (the control plane's or the
// cache's), else the one Envoy acknowledged or kept.
func TestSotWResubscribeDeclaresTheVersionInFlight(t *testing.T) {
	c := lkg.New(1<<30, slog.New(slog.DiscardHandler))
	declared := func(x Tracker[*discoveryv3.DiscoveryRequest]) string {
		t.Helper()
		reqs := x.Resubscribe()
		if len(reqs) != 1 || reqs[0].GetTypeUrl() != resource.ClusterType || reqs[0].GetResponseNonce() != "" {
			t.Fatalf("resubscribed with %v, want one request for clusters, no nonce", reqs)
		}
		return reqs[0].GetVersionInfo()
	}
	request := func(version, nonce string, nack bool) *discoveryv3.DiscoveryRequest {
		r := &discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: version, ResponseNonce: nonce}
		if nack {
			r.ErrorDetail = &rpcstatus.Status{Message: "rejected"}
		}
		return r
	}

	// From the control plane.
	x := SotW{}.NewTracker(1)
	x.Observe(request("", "", false), true, c)
	if v := declared(x); v != "" {
		t.Errorf("nothing sent yet: declared %q, want none", v)
	}
	f := &rawxds.Frame{Body: xdsserver.Pieces(xdsserver.SotWResponse(t, "v1", "n1", 1), 100)}
	if err := f.Scan(); err != nil {
		t.Fatal(err)
	}
	x.Sending(f, c)
	if v := declared(x); v != "v1" {
		t.Errorf("v1 in flight: declared %q, want v1", v)
	}
	x.Observe(request("v1", "n1", false), true, c)
	if v := declared(x); v != "v1" {
		t.Errorf("v1 acknowledged: declared %q, want v1", v)
	}

	// From the cache (v1, acknowledged above), to a fresh Envoy.
	for _, nack := range []bool{false, true} {
		y := SotW{}.NewTracker(2)
		y.Observe(request("", "", false), true, c)
		sent := y.Replay(c)
		if len(sent) != 1 || sent[0].Version != "v1" {
			t.Fatalf("the cache served %v, want v1", sent)
		}
		if v := declared(y); v != "v1" {
			t.Errorf("the cache's v1 in flight: declared %q, want v1", v)
		}
		want := "v1" // what Envoy holds after its answer: v1 accepted, or nothing kept
		if nack {
			want = ""
		}
		y.Observe(request(want, sent[0].Nonce, nack), true, c)
		if v := declared(y); v != want {
			t.Errorf("the cache's v1 answered (NACK %v): declared %q, want %q", nack, v, want)
		}
	}
}
