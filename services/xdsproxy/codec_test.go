package xdsproxy

import (
	"errors"
	"log/slog"
	"testing"
	"time"

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
	f := frame{b: b}
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
	if err := proto.Unmarshal(withNonce(b, "mine"), &got); err != nil {
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
		f := frame{b: bad}
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
	if f.nonce != "n1" || string(f.b) != string(b) {
		t.Fatalf("unmarshalled %+v", f.nonce)
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
		f := &frame{b: b}
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
	c.putSotW(resource.ClusterType, make([]byte, 600), "v1")
	if len(c.servable(modeSotW)) != 1 {
		t.Fatal("not cached under the bound")
	}
	c.putSotW(resource.ListenerType, make([]byte, 600), "v1")
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
		resource.ClusterType: {b: sotwResponse(t, "v1", "n", 2), version: "v1"},
	}}
	b := encodeCache(cacheHeader{nodeID: "node", address: "cp:15012", written: time.Unix(100, 0)}, sotw)
	h, got, err := decodeCache(b)
	if err != nil {
		t.Fatal(err)
	}
	if h.nodeID != "node" || h.address != "cp:15012" || !h.written.Equal(time.Unix(100, 0)) || got.mode != modeSotW {
		t.Errorf("header %+v mode %v", h, got.mode)
	}
	if string(got.sotw[resource.ClusterType].b) != string(sotw.sotw[resource.ClusterType].b) {
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
		{mode: modeSotW, sotw: map[string]sotwEntry{resource.ClusterType: {b: sotwResponse(t, "v1", "n", 200), version: "v1"}}},
		{mode: modeDelta, delta: map[string]deltaSnapshot{resource.ClusterType: {version: "3", res: map[string]deltaRes{
			"a": {version: "a1", b: deltaResource(t, "a", "a1", nil)},
		}}}},
	} {
		if got, want := cacheSize(h, s), int64(len(encodeCache(h, s))); got != want {
			t.Errorf("%v: cacheSize %d, file %d bytes", s.mode, got, want)
		}
	}
}
