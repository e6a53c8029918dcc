package xdsproxy

import (
	"bytes"
	"errors"
	"log/slog"
	"runtime"
	"testing"
	"time"
	"weak"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// The Delta cache applies what Envoy acknowledged: updates, removals,
// heartbeats (no body: nothing changes), and never keeps a resource that
// must not be cached (do_not_cache, or a TTL).
func TestDeltaCacheApply(t *testing.T) {
	c := newLKG(1<<20, slog.New(slog.DiscardHandler))
	apply := func(version string, removed []string, res ...[]byte) {
		t.Helper()
		b := rawxds.DeltaResponse(resource.ClusterType, version, "n", res)
		if len(removed) > 0 {
			r := &discoveryv3.DeltaDiscoveryResponse{RemovedResources: removed}
			extra, _ := proto.Marshal(r)
			b = append(b, extra...)
		}
		f := &rawxds.Frame{Body: rawxds.Body{b}}
		if err := f.Scan(); err != nil {
			t.Fatal(err)
		}
		c.applyDelta(resource.ClusterType, f)
	}
	c.startDelta(resource.ClusterType, nil)
	apply("1", nil, xdsserver.DeltaResource(t, "a", "a1", nil), xdsserver.DeltaResource(t, "b", "b1", nil), xdsserver.DeltaResource(t, "c", "c1", nil))
	apply("2", []string{"b"},
		xdsserver.DeltaResource(t, "a", "a2", nil),
		xdsserver.DeltaResource(t, "c", "", func(r *discoveryv3.Resource) { r.Resource = nil }), // heartbeat
		xdsserver.DeltaResource(t, "d", "d1", func(r *discoveryv3.Resource) {
			r.CacheControl = &discoveryv3.Resource_CacheControl{DoNotCache: true}
		}),
		xdsserver.DeltaResource(t, "e", "e1", func(r *discoveryv3.Resource) { r.Ttl = durationpb.New(time.Minute) }),
	)
	res, version, ok := c.getDelta(resource.ClusterType)
	if !ok || version != "2" {
		t.Fatalf("getDelta: ok %v version %q", ok, version)
	}
	got := map[string]string{}
	for n, r := range res {
		got[n] = r.version
	}
	want := map[string]string{"a": "a2", "c": "c1"}
	if len(got) != len(want) || got["a"] != "a2" || got["c"] != "c1" {
		t.Errorf("cached %v, want %v", got, want)
	}

	// Envoy reconnects holding something the cache never saw: incomplete.
	c.startDelta(resource.ClusterType, map[string]string{"a": "a2", "z": "z9"})
	if _, _, ok := c.getDelta(resource.ClusterType); ok {
		t.Error("an incomplete set is served")
	}
	// A fresh Envoy: the set starts again from nothing, complete.
	c.startDelta(resource.ClusterType, nil)
	apply("3", nil, xdsserver.DeltaResource(t, "x", "x1", nil))
	if res, _, ok := c.getDelta(resource.ClusterType); !ok || len(res) != 1 {
		t.Errorf("after a fresh start: ok %v, %d resources", ok, len(res))
	}
}

// Past CacheMaxBytes nothing is cached, rather than a part.
func TestCacheBound(t *testing.T) {
	c := newLKG(1000, slog.New(slog.DiscardHandler))
	c.putSotW(resource.ClusterType, rawxds.Body{make([]byte, 600)}, "v1")
	if len(c.servable(modeSotW)) != 1 {
		t.Fatal("not cached under the bound")
	}
	c.putSotW(resource.ListenerType, rawxds.Body{make([]byte, 600)}, "v1")
	if got := c.servable(modeSotW); len(got) != 0 {
		t.Errorf("serving %v past the bound", got)
	}
	if s := c.snapshot(); !s.disabled {
		t.Error("the snapshot does not say the cache is disabled (the file must go)")
	}
}

// The file format round-trips both protocols, and its checksum catches
// every single-byte change.
func TestCacheFileRoundTrip(t *testing.T) {
	sotw := cacheSnapshot{mode: modeSotW, sotw: map[string]sotwEntry{
		resource.ClusterType: {b: rawxds.Body{xdsserver.SotWResponse(t, "v1", "n", 2)}, version: "v1"},
	}}
	b := encodeCache(cacheHeader{nodeID: "node", address: "cp:15012", written: time.Unix(100, 0)}, sotw)
	h, got, err := decodeCache(b)
	if err != nil {
		t.Fatal(err)
	}
	if h.nodeID != "node" || h.address != "cp:15012" || !h.written.Equal(time.Unix(100, 0)) || got.mode != modeSotW {
		t.Errorf("header %+v mode %v", h, got.mode)
	}
	if string(got.sotw[resource.ClusterType].b.Bytes()) != string(sotw.sotw[resource.ClusterType].b.Bytes()) {
		t.Error("SotW entry changed")
	}
	for i := range b {
		if _, _, err := decodeCache(flipByte(b, i)); !errors.Is(err, errCacheFile) {
			t.Fatalf("a change at byte %d went unnoticed", i)
		}
	}

	delta := cacheSnapshot{mode: modeDelta, delta: map[string]deltaSnapshot{
		resource.ClusterType: {version: "3", res: map[string]deltaRes{
			"a": {version: "a1", b: xdsserver.DeltaResource(t, "a", "a1", nil)},
			"b": {version: "b1", b: xdsserver.DeltaResource(t, "b", "b1", nil)},
		}},
	}}
	_, got, err = decodeCache(encodeCache(cacheHeader{nodeID: "node", address: "cp:15012"}, delta))
	if err != nil {
		t.Fatal(err)
	}
	d := got.delta[resource.ClusterType]
	if d.version != "3" || len(d.res) != 2 || d.res["b"].version != "b1" {
		t.Errorf("delta entry %+v", d)
	}
}

// cacheSize predicts the streamed file's size exactly (the bound is
// checked before writing).
func TestCacheSizeMatchesFile(t *testing.T) {
	h := cacheHeader{nodeID: "node", address: "cp:15012", written: time.Unix(5, 0)}
	for _, s := range []cacheSnapshot{
		{mode: modeSotW, sotw: map[string]sotwEntry{resource.ClusterType: {b: rawxds.Body{xdsserver.SotWResponse(t, "v1", "n", 200)}, version: "v1"}}},
		{mode: modeDelta, delta: map[string]deltaSnapshot{resource.ClusterType: {version: "3", res: map[string]deltaRes{
			"a": {version: "a1", b: xdsserver.DeltaResource(t, "a", "a1", nil)},
		}}}},
	} {
		if got, want := cacheSize(h, s), int64(len(encodeCache(h, s))); got != want {
			t.Errorf("%v: cacheSize %d, file %d bytes", s.mode, got, want)
		}
	}
}

// What Envoy acknowledged is kept as the pieces received, not a copy.
func TestLastKnownGoodHoldsTheReceivedBytes(t *testing.T) {
	f := &rawxds.Frame{Body: xdsserver.Pieces(xdsserver.SotWResponse(t, "v1", "n1", 100), 1000)}
	if err := f.Scan(); err != nil {
		t.Fatal(err)
	}
	c := newLKG(1<<30, slog.New(slog.DiscardHandler))
	x := sotw{}.newTracker(1)
	x.sending(f, c)
	x.observe(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v1", ResponseNonce: "n1"}, true, c)
	e, ok := c.getSotW(resource.ClusterType)
	if !ok || len(e.b) != len(f.Body) {
		t.Fatalf("cached %v: %d pieces, want %d", ok, len(e.b), len(f.Body))
	}
	for i := range e.b {
		if &e.b[i][0] != &f.Body[i][0] {
			t.Fatalf("piece %d is a copy", i)
		}
	}
	// A reply from the cache shares them too: only the new nonce is new.
	served := x.replay(c)
	if len(served) != 1 || &served[0].Body[0][0] != &f.Body[0][0] || len(served[0].Body) != len(f.Body)+1 {
		t.Fatalf("served %d frames", len(served))
	}
}

// A Delta response Envoy acknowledged is no longer held by the stream: the
// cache keeps its resources, and the frame (with every piece of the
// response) goes (#24: the pending list's array kept it until the next).
func TestAcknowledgedDeltaFrameIsReleased(t *testing.T) {
	c := newLKG(1<<30, slog.New(slog.DiscardHandler))
	x := delta{}.newTracker(1)
	x.observe(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType}, true, c)
	f := &rawxds.Frame{Body: xdsserver.Pieces(rawxds.DeltaResponse(resource.ClusterType, "1", "n1", [][]byte{xdsserver.DeltaResource(t, "a", "a1", nil)}), 100)}
	if err := f.Scan(); err != nil {
		t.Fatal(err)
	}
	x.sending(f, c)
	held := weak.Make(f)
	f = nil
	x.observe(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: "n1"}, true, c)
	if _, _, ok := c.getDelta(resource.ClusterType); !ok {
		t.Fatal("the acknowledged response is not cached")
	}
	runtime.GC()
	if held.Value() != nil {
		t.Error("the stream still holds the acknowledged frame")
	}
	runtime.KeepAlive(x)
}

// A response in pieces is written to the cache file as the same response
// in one, byte for byte (#24: the frame is no longer joined).
func TestCacheFileOfBodyInPieces(t *testing.T) {
	sotwB := xdsserver.SotWResponse(t, "v2", "n2", 300)
	for _, size := range []int{1, 7, 1000, 16 << 10} {
		h := cacheHeader{nodeID: "node", address: "cp:15012", written: time.Unix(5, 0)}
		one := cacheSnapshot{mode: modeSotW, sotw: map[string]sotwEntry{resource.ClusterType: {b: rawxds.Body{sotwB}, version: "v2"}}}
		many := cacheSnapshot{mode: modeSotW, sotw: map[string]sotwEntry{resource.ClusterType: {b: xdsserver.Pieces(sotwB, size), version: "v2"}}}
		if !bytes.Equal(encodeCache(h, one), encodeCache(h, many)) || cacheSize(h, many) != int64(len(encodeCache(h, one))) {
			t.Fatalf("pieces of %d: the cache file differs", size)
		}
	}
}
