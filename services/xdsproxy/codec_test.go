package xdsproxy

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"
	"weak"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

func sotwResponse(t testing.TB, version, nonce string, n int) []byte {
	t.Helper()
	r := &discoveryv3.DiscoveryResponse{VersionInfo: version, TypeUrl: resource.ClusterType, Nonce: nonce}
	for _, c := range xdsserver.Clusters(n, "c-") {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		r.Resources = append(r.Resources, a)
	}
	b, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The scan reads what the proxy needs; a nonce appended replaces the old
// one for any decoder, and nothing else changes.
func TestScanAndReplaceNonce(t *testing.T) {
	b := sotwResponse(t, "v7", "upstream-nonce", 3)
	f := frame{body: body{b}}
	if err := f.scan(); err != nil {
		t.Fatal(err)
	}
	if f.typeURL != resource.ClusterType || f.nonce != "upstream-nonce" || f.version != "v7" || f.resources != 3 {
		t.Fatalf("scan = %+v", f)
	}
	var orig, got discoveryv3.DiscoveryResponse
	if err := proto.Unmarshal(b, &orig); err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(withNonce(body{b}, "mine").bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.GetNonce() != "mine" {
		t.Errorf("nonce %q, want mine", got.GetNonce())
	}
	got.Nonce = orig.GetNonce()
	if !proto.Equal(&got, &orig) {
		t.Error("replacing the nonce changed the response")
	}
	for _, bad := range [][]byte{{0x0a}, {0x0a, 0x05, 'a'}, {0xff}, {0x22, 0x80}} {
		f := frame{body: body{bad}}
		if err := f.scan(); !errors.Is(err, errMalformed) {
			t.Errorf("scan(%x) = %v, want errMalformed", bad, err)
		}
	}
}

// The codec passes frames as bytes, in one piece whatever gRPC's buffers.
func TestRawCodec(t *testing.T) {
	c := newRawCodec()
	b := sotwResponse(t, "v1", "n1", 50)
	// gRPC hands a large message over in several buffers.
	var data mem.BufferSlice
	for rest := b; len(rest) > 0; {
		n := min(len(rest), 1000)
		data = append(data, mem.SliceBuffer(rest[:n]))
		rest = rest[n:]
	}
	var f frame
	if err := c.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if f.nonce != "n1" || string(f.body.bytes()) != string(b) {
		t.Fatalf("unmarshalled %+v", f.nonce)
	}
	// Held as gRPC's buffers, not a copy of them (#24).
	if len(f.body) != len(data) || &f.body[0][0] != &b[0] || &f.body[len(f.body)-1][0] != &data[len(data)-1].ReadOnlyData()[0] {
		t.Error("the frame copied gRPC's buffers")
	}
	out, err := c.Marshal(&f)
	if err != nil {
		t.Fatal(err)
	}
	if string(out.Materialize()) != string(b) {
		t.Error("marshalled frame differs from its bytes")
	}
	// Requests go through protobuf.
	req := &discoveryv3.DiscoveryRequest{TypeUrl: resource.ListenerType, ResponseNonce: "x"}
	rb, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var back discoveryv3.DiscoveryRequest
	if err := c.Unmarshal(rb, &back); err != nil || !proto.Equal(req, &back) {
		t.Errorf("request round trip: %v, %v", &back, err)
	}
}

func deltaResource(t *testing.T, name, version string, mod func(*discoveryv3.Resource)) []byte {
	t.Helper()
	a, err := anypb.New(xdsserver.Cluster(name))
	if err != nil {
		t.Fatal(err)
	}
	r := &discoveryv3.Resource{Name: name, Version: version, Resource: a}
	if mod != nil {
		mod(r)
	}
	b, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The Delta cache applies what Envoy acknowledged: updates, removals,
// heartbeats (no body: nothing changes), and never keeps a resource that
// must not be cached (do_not_cache, or a TTL).
func TestDeltaCacheApply(t *testing.T) {
	c := newLKG(1<<20, slog.New(slog.DiscardHandler))
	apply := func(version string, removed []string, res ...[]byte) {
		t.Helper()
		b := deltaResponse(resource.ClusterType, version, "n", res)
		if len(removed) > 0 {
			r := &discoveryv3.DeltaDiscoveryResponse{RemovedResources: removed}
			extra, _ := proto.Marshal(r)
			b = append(b, extra...)
		}
		f := &frame{body: body{b}}
		if err := f.scan(); err != nil {
			t.Fatal(err)
		}
		c.applyDelta(resource.ClusterType, f)
	}
	c.startDelta(resource.ClusterType, nil)
	apply("1", nil, deltaResource(t, "a", "a1", nil), deltaResource(t, "b", "b1", nil), deltaResource(t, "c", "c1", nil))
	apply("2", []string{"b"},
		deltaResource(t, "a", "a2", nil),
		deltaResource(t, "c", "", func(r *discoveryv3.Resource) { r.Resource = nil }), // heartbeat
		deltaResource(t, "d", "d1", func(r *discoveryv3.Resource) {
			r.CacheControl = &discoveryv3.Resource_CacheControl{DoNotCache: true}
		}),
		deltaResource(t, "e", "e1", func(r *discoveryv3.Resource) { r.Ttl = durationpb.New(time.Minute) }),
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
	apply("3", nil, deltaResource(t, "x", "x1", nil))
	if res, _, ok := c.getDelta(resource.ClusterType); !ok || len(res) != 1 {
		t.Errorf("after a fresh start: ok %v, %d resources", ok, len(res))
	}
}

// Past CacheMaxBytes nothing is cached, rather than a part.
func TestCacheBound(t *testing.T) {
	c := newLKG(1000, slog.New(slog.DiscardHandler))
	c.putSotW(resource.ClusterType, body{make([]byte, 600)}, "v1")
	if len(c.servable(modeSotW)) != 1 {
		t.Fatal("not cached under the bound")
	}
	c.putSotW(resource.ListenerType, body{make([]byte, 600)}, "v1")
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
		resource.ClusterType: {b: body{sotwResponse(t, "v1", "n", 2)}, version: "v1"},
	}}
	b := encodeCache(cacheHeader{nodeID: "node", address: "cp:15012", written: time.Unix(100, 0)}, sotw)
	h, got, err := decodeCache(b)
	if err != nil {
		t.Fatal(err)
	}
	if h.nodeID != "node" || h.address != "cp:15012" || !h.written.Equal(time.Unix(100, 0)) || got.mode != modeSotW {
		t.Errorf("header %+v mode %v", h, got.mode)
	}
	if string(got.sotw[resource.ClusterType].b.bytes()) != string(sotw.sotw[resource.ClusterType].b.bytes()) {
		t.Error("SotW entry changed")
	}
	for i := range b {
		if _, _, err := decodeCache(flipByte(b, i)); !errors.Is(err, errCacheFile) {
			t.Fatalf("a change at byte %d went unnoticed", i)
		}
	}

	delta := cacheSnapshot{mode: modeDelta, delta: map[string]deltaSnapshot{
		resource.ClusterType: {version: "3", res: map[string]deltaRes{
			"a": {version: "a1", b: deltaResource(t, "a", "a1", nil)},
			"b": {version: "b1", b: deltaResource(t, "b", "b1", nil)},
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
		{mode: modeSotW, sotw: map[string]sotwEntry{resource.ClusterType: {b: body{sotwResponse(t, "v1", "n", 200)}, version: "v1"}}},
		{mode: modeDelta, delta: map[string]deltaSnapshot{resource.ClusterType: {version: "3", res: map[string]deltaRes{
			"a": {version: "a1", b: deltaResource(t, "a", "a1", nil)},
		}}}},
	} {
		if got, want := cacheSize(h, s), int64(len(encodeCache(h, s))); got != want {
			t.Errorf("%v: cacheSize %d, file %d bytes", s.mode, got, want)
		}
	}
}

// pieces splits b as gRPC hands a message over: in buffers of size bytes
// (16 KiB, HTTP/2's default frame size, from a control plane).
func pieces(b []byte, size int) body {
	var out body
	for len(b) > 0 {
		n := min(len(b), size)
		out = append(out, b[:n:n])
		b = b[n:]
	}
	return out
}

// A response in pieces reads as the same response in one: the scan, the
// Delta split, and the cache file, byte for byte (#24: the frame is no
// longer joined).
func TestBodyInPieces(t *testing.T) {
	sotwB := sotwResponse(t, "v2", "n2", 300)
	var res [][]byte
	for i := range 300 {
		res = append(res, deltaResource(t, fmt.Sprintf("c-%d", i), "r1", nil))
	}
	deltaB := deltaResponse(resource.ClusterType, "7", "n3", res)
	for _, size := range []int{1, 7, 1000, 16 << 10} {
		whole, split := frame{body: body{sotwB}}, frame{body: pieces(sotwB, size)}
		if err := whole.scan(); err != nil {
			t.Fatal(err)
		}
		if err := split.scan(); err != nil || split.typeURL != whole.typeURL || split.nonce != "n2" || split.version != "v2" || split.resources != 300 {
			t.Fatalf("pieces of %d: scan %+v, %v", size, split, err)
		}
		got, err := splitDelta(pieces(deltaB, size), len(res))
		if err != nil || len(got.resources) != len(res) {
			t.Fatalf("pieces of %d: %d resources, %v", size, len(got.resources), err)
		}
		for i, r := range got.resources {
			if !bytes.Equal(r, res[i]) {
				t.Fatalf("pieces of %d: resource %d differs", size, i)
			}
		}
		h := cacheHeader{nodeID: "node", address: "cp:15012", written: time.Unix(5, 0)}
		one := cacheSnapshot{mode: modeSotW, sotw: map[string]sotwEntry{resource.ClusterType: {b: body{sotwB}, version: "v2"}}}
		many := cacheSnapshot{mode: modeSotW, sotw: map[string]sotwEntry{resource.ClusterType: {b: pieces(sotwB, size), version: "v2"}}}
		if !bytes.Equal(encodeCache(h, one), encodeCache(h, many)) || cacheSize(h, many) != int64(len(encodeCache(h, one))) {
			t.Fatalf("pieces of %d: the cache file differs", size)
		}
	}
}

// What Envoy acknowledged is kept as the pieces received, not a copy.
func TestLastKnownGoodHoldsTheReceivedBytes(t *testing.T) {
	f := &frame{body: pieces(sotwResponse(t, "v1", "n1", 100), 1000)}
	if err := f.scan(); err != nil {
		t.Fatal(err)
	}
	c := newLKG(1<<30, slog.New(slog.DiscardHandler))
	x := sotw{}.newTracker(1)
	x.sending(f, c)
	x.observe(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v1", ResponseNonce: "n1"}, true, c)
	e, ok := c.getSotW(resource.ClusterType)
	if !ok || len(e.b) != len(f.body) {
		t.Fatalf("cached %v: %d pieces, want %d", ok, len(e.b), len(f.body))
	}
	for i := range e.b {
		if &e.b[i][0] != &f.body[i][0] {
			t.Fatalf("piece %d is a copy", i)
		}
	}
	// A reply from the cache shares them too: only the new nonce is new.
	served := x.replay(c)
	if len(served) != 1 || &served[0].body[0][0] != &f.body[0][0] || len(served[0].body) != len(f.body)+1 {
		t.Fatalf("served %d frames", len(served))
	}
}

// BenchmarkUnmarshalFrame: what receiving a 10,000-cluster push costs the
// codec (#24: a joined copy of 3.7 MB before; gRPC's buffers now).
func BenchmarkUnmarshalFrame(b *testing.B) {
	msg := sotwResponse(b, "v1", "n1", 10000)
	var data mem.BufferSlice
	for _, p := range pieces(msg, 16<<10) {
		data = append(data, mem.SliceBuffer(p))
	}
	c := newRawCodec()
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		var f frame
		if err := c.Unmarshal(data, &f); err != nil {
			b.Fatal(err)
		}
	}
}

// A Delta response Envoy acknowledged is no longer held by the stream: the
// cache keeps its resources, and the frame (with every piece of the
// response) goes (#24: the pending list's array kept it until the next).
func TestAcknowledgedDeltaFrameIsReleased(t *testing.T) {
	c := newLKG(1<<30, slog.New(slog.DiscardHandler))
	x := delta{}.newTracker(1)
	x.observe(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType}, true, c)
	f := &frame{body: pieces(deltaResponse(resource.ClusterType, "1", "n1", [][]byte{deltaResource(t, "a", "a1", nil)}), 100)}
	if err := f.scan(); err != nil {
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
