package lkg

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"log/slog"
	"testing"
	"time"

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
	c := New(1<<20, slog.New(slog.DiscardHandler))
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
		c.ApplyDelta(resource.ClusterType, f)
	}
	c.StartDelta(resource.ClusterType, nil)
	apply("1", nil, xdsserver.DeltaResource(t, "a", "a1", nil), xdsserver.DeltaResource(t, "b", "b1", nil), xdsserver.DeltaResource(t, "c", "c1", nil))
	apply("2", []string{"b"},
		xdsserver.DeltaResource(t, "a", "a2", nil),
		xdsserver.DeltaResource(t, "c", "", func(r *discoveryv3.Resource) { r.Resource = nil }), // heartbeat
		xdsserver.DeltaResource(t, "d", "d1", func(r *discoveryv3.Resource) {
			r.CacheControl = &discoveryv3.Resource_CacheControl{DoNotCache: true}
		}),
		xdsserver.DeltaResource(t, "e", "e1", func(r *discoveryv3.Resource) { r.Ttl = durationpb.New(time.Minute) }),
	)
	res, version, ok := c.Delta(resource.ClusterType)
	if !ok || version != "2" {
		t.Fatalf("getDelta: ok %v version %q", ok, version)
	}
	got := map[string]string{}
	for n, r := range res {
		got[n] = r.Version
	}
	want := map[string]string{"a": "a2", "c": "c1"}
	if len(got) != len(want) || got["a"] != "a2" || got["c"] != "c1" {
		t.Errorf("cached %v, want %v", got, want)
	}

	// Envoy reconnects holding something the cache never saw: incomplete.
	c.StartDelta(resource.ClusterType, map[string]string{"a": "a2", "z": "z9"})
	if _, _, ok := c.Delta(resource.ClusterType); ok {
		t.Error("an incomplete set is served")
	}
	// A fresh Envoy: the set starts again from nothing, complete.
	c.StartDelta(resource.ClusterType, nil)
	apply("3", nil, xdsserver.DeltaResource(t, "x", "x1", nil))
	if res, _, ok := c.Delta(resource.ClusterType); !ok || len(res) != 1 {
		t.Errorf("after a fresh start: ok %v, %d resources", ok, len(res))
	}
}

// Past CacheMaxBytes nothing is cached, rather than a part.
func TestCacheBound(t *testing.T) {
	c := New(1000, slog.New(slog.DiscardHandler))
	c.PutSotW(resource.ClusterType, rawxds.Body{make([]byte, 600)}, "v1")
	if len(c.Servable(ModeSotW)) != 1 {
		t.Fatal("not cached under the bound")
	}
	c.PutSotW(resource.ListenerType, rawxds.Body{make([]byte, 600)}, "v1")
	if got := c.Servable(ModeSotW); len(got) != 0 {
		t.Errorf("serving %v past the bound", got)
	}
	if s := c.Snapshot(); !s.Disabled {
		t.Error("the snapshot does not say the cache is disabled (the file must go)")
	}
}

// The file format round-trips both protocols, and its checksum catches
// every single-byte change.
func TestCacheFileRoundTrip(t *testing.T) {
	sotw := Snapshot{Mode: ModeSotW, SotW: map[string]SotWEntry{
		resource.ClusterType: {Response: rawxds.Body{xdsserver.SotWResponse(t, "v1", "n", 2)}, Version: "v1"},
	}}
	b := encode(Header{NodeID: "node", Address: "cp:15012", Written: time.Unix(100, 0)}, sotw)
	h, got, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if h.NodeID != "node" || h.Address != "cp:15012" || !h.Written.Equal(time.Unix(100, 0)) || got.Mode != ModeSotW {
		t.Errorf("header %+v mode %v", h, got.Mode)
	}
	if string(got.SotW[resource.ClusterType].Response.Bytes()) != string(sotw.SotW[resource.ClusterType].Response.Bytes()) {
		t.Error("SotW entry changed")
	}
	for i := range b {
		if _, _, err := decode(flipByte(b, i)); !errors.Is(err, ErrFile) {
			t.Fatalf("a change at byte %d went unnoticed", i)
		}
	}

	delta := Snapshot{Mode: ModeDelta, Delta: map[string]DeltaSnapshot{
		resource.ClusterType: {Version: "3", Resources: map[string]DeltaRes{
			"a": {Version: "a1", Resource: xdsserver.DeltaResource(t, "a", "a1", nil)},
			"b": {Version: "b1", Resource: xdsserver.DeltaResource(t, "b", "b1", nil)},
		}},
	}}
	_, got, err = decode(encode(Header{NodeID: "node", Address: "cp:15012"}, delta))
	if err != nil {
		t.Fatal(err)
	}
	d := got.Delta[resource.ClusterType]
	if d.Version != "3" || len(d.Resources) != 2 || d.Resources["b"].Version != "b1" {
		t.Errorf("delta entry %+v", d)
	}
}

// cacheSize predicts the streamed file's size exactly (the bound is
// checked before writing).
func TestCacheSizeMatchesFile(t *testing.T) {
	h := Header{NodeID: "node", Address: "cp:15012", Written: time.Unix(5, 0)}
	for _, s := range []Snapshot{
		{Mode: ModeSotW, SotW: map[string]SotWEntry{resource.ClusterType: {Response: rawxds.Body{xdsserver.SotWResponse(t, "v1", "n", 200)}, Version: "v1"}}},
		{Mode: ModeDelta, Delta: map[string]DeltaSnapshot{resource.ClusterType: {Version: "3", Resources: map[string]DeltaRes{
			"a": {Version: "a1", Resource: xdsserver.DeltaResource(t, "a", "a1", nil)},
		}}}},
	} {
		if got, want := FileSize(h, s), int64(len(encode(h, s))); got != want {
			t.Errorf("%v: cacheSize %d, file %d bytes", s.Mode, got, want)
		}
	}
}

// A response in pieces is written to the cache file as the same response
// in one, byte for byte (#24: the frame is no longer joined).
func TestCacheFileOfBodyInPieces(t *testing.T) {
	sotwB := xdsserver.SotWResponse(t, "v2", "n2", 300)
	for _, size := range []int{1, 7, 1000, 16 << 10} {
		h := Header{NodeID: "node", Address: "cp:15012", Written: time.Unix(5, 0)}
		one := Snapshot{Mode: ModeSotW, SotW: map[string]SotWEntry{resource.ClusterType: {Response: rawxds.Body{sotwB}, Version: "v2"}}}
		many := Snapshot{Mode: ModeSotW, SotW: map[string]SotWEntry{resource.ClusterType: {Response: xdsserver.Pieces(sotwB, size), Version: "v2"}}}
		if !bytes.Equal(encode(h, one), encode(h, many)) || FileSize(h, many) != int64(len(encode(h, one))) {
			t.Fatalf("pieces of %d: the cache file differs", size)
		}
	}
}

// A name table alone (NDS answered before Envoy acknowledged anything) is
// a valid cache file.
func TestCacheFileNamesOnly(t *testing.T) {
	h := Header{NodeID: testNode, Address: "istiod:15012"}
	names := &NamesEntry{Table: []byte{0x0a, 0x00}, Version: "n1"}
	b := encode(h, Snapshot{Names: names})
	if int64(len(b)) != FileSize(h, Snapshot{Names: names}) {
		t.Errorf("cacheSize %d, file %d bytes", FileSize(h, Snapshot{Names: names}), len(b))
	}
	_, s, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode != ModeNone || s.Names == nil || s.Names.Version != "n1" || !bytes.Equal(s.Names.Table, names.Table) {
		t.Errorf("decoded %+v, names %+v; want the name table alone", s, s.Names)
	}
}

// The fuzz targets of the cache and its file, whose input is the control
// plane's (and the file, written by an earlier run).

// FuzzDeltaCache feeds Delta responses, as Envoy would have acknowledged
// them, to the cache, then writes and reads back the cache file: what the
// cache keeps is what the file gives back.
func FuzzDeltaCache(f *testing.F) {
	f.Add(rawxds.DeltaResponse(resource.ClusterType, "3", "n", [][]byte{{0x1a, 0x01, 'a', 0x12, 0x00}}), []byte{0x0a, 0x00})
	f.Add(xdsserver.SotWResponse(f, "v", "n", 2), []byte(nil))
	f.Fuzz(func(t *testing.T, b, table []byte) {
		c := New(1<<40, slog.New(slog.DiscardHandler))
		fr := &rawxds.Frame{Body: rawxds.Body{b}}
		if fr.Scan() != nil {
			return
		}
		c.StartDelta(resource.ClusterType, nil)
		c.ApplyDelta(resource.ClusterType, fr)
		c.PutNames(table, "nt")
		snap := c.Snapshot()
		h := Header{NodeID: testNode, Address: "istiod:15012", Written: time.Unix(1, 0)}
		file := encode(h, snap)
		if got := FileSize(h, snap); got != int64(len(file)) {
			t.Fatalf("cacheSize %d, file %d bytes", got, len(file))
		}
		h2, back, err := decode(file)
		if err != nil {
			t.Fatalf("the cache file written does not decode: %v", err)
		}
		if h2.NodeID != h.NodeID || back.Mode != snap.Mode || !bytes.Equal(back.Names.Table, table) {
			t.Fatalf("read back %+v, %+v; wrote %+v, %+v", h2, back, h, snap)
		}
		for typeURL, d := range snap.Delta {
			got := back.Delta[typeURL]
			if got.Version != d.Version || len(got.Resources) != len(d.Resources) {
				t.Fatalf("%s read back %d resources at %q, wrote %d at %q", typeURL, len(got.Resources), got.Version, len(d.Resources), d.Version)
			}
			for name, r := range d.Resources {
				if g := got.Resources[name]; g.Version != r.Version || !bytes.Equal(g.Resource, r.Resource) {
					t.Fatalf("%s resource %q read back differs", typeURL, name)
				}
			}
		}
	})
}

// FuzzCacheFile feeds arbitrary bytes as the cache file, as they are
// and with a valid checksum (so that the fuzzer gets past it to the
// payload): the decoder never panics, and what it accepts is written back
// to a file that decodes to the same.
func FuzzCacheFile(f *testing.F) {
	h := Header{NodeID: testNode, Address: "istiod:15012", Written: time.Unix(5, 0)}
	for _, file := range [][]byte{
		encode(h, Snapshot{Mode: ModeSotW, SotW: map[string]SotWEntry{resource.ClusterType: {Response: rawxds.Body{xdsserver.SotWResponse(f, "v1", "n", 2)}, Version: "v1"}}}),
		encode(h, Snapshot{Mode: ModeDelta, Delta: map[string]DeltaSnapshot{resource.ClusterType: {Version: "3", Resources: map[string]DeltaRes{
			"a": {Version: "a1", Resource: []byte{0x1a, 0x01, 'a', 0x0a, 0x02, 'a', '1', 0x12, 0x00}},
		}}}, Names: &NamesEntry{Table: []byte{0x0a, 0x00}, Version: "n1"}}),
		encode(h, Snapshot{Names: &NamesEntry{Table: nil, Version: ""}}),
	} {
		f.Add(file[len(cacheMagic) : len(file)-checksumSize])
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		_, _, _ = decode(payload)
		file := append([]byte(cacheMagic), payload...)
		file = binary.BigEndian.AppendUint32(file, crc32.Checksum(file, castagnoli))
		h, s, err := decode(file)
		if err != nil {
			return
		}
		h2, s2, err := decode(encode(h, s))
		if err != nil {
			t.Fatalf("a decoded cache written back does not decode: %v", err)
		}
		if h2 != h || s2.Mode != s.Mode || len(s2.SotW) != len(s.SotW) || len(s2.Delta) != len(s.Delta) || (s2.Names == nil) != (s.Names == nil) {
			t.Fatalf("round trip: %+v %+v, want %+v %+v", h2, s2, h, s)
		}
	})
}

const testNode = "sidecar~127.0.0.1~test.default~default.svc.cluster.local"

func flipByte(b []byte, i int) []byte {
	out := append([]byte(nil), b...)
	out[i] ^= 0x5a
	return out
}

// encode is the file image of a snapshot, in one slice (the agent streams
// it with Write instead of holding a second copy of the cache).
func encode(h Header, s Snapshot) []byte {
	var buf bytes.Buffer
	_ = Write(&buf, h, s)
	return buf.Bytes()
}
