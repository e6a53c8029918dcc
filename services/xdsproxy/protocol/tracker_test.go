package protocol

import (
	"log/slog"
	"runtime"
	"testing"
	"weak"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

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
