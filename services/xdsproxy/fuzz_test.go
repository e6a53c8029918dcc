package xdsproxy

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"log/slog"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// The fuzz targets of the proxy's parsers of outside input: responses
// from the control plane (scanned, never decoded, when forwarded; decoded
// for the agent's own types), and the cache file.

// agentResponses are responses of the agent's own types, both protocols.
func agentResponses(f *testing.F) [][]byte {
	nt, err := anypb.New(xdsserver.NameTable(map[string]string{"reviews.default.svc.cluster.local": "10.0.0.1", "v6.example": "2001:db8::1"}))
	if err != nil {
		f.Fatal(err)
	}
	pc, err := anypb.New(&meshconfig.ProxyConfig{CaCertificatesPem: []string{"not pem"}})
	if err != nil {
		f.Fatal(err)
	}
	var out [][]byte
	for _, m := range []proto.Message{
		&discoveryv3.DiscoveryResponse{VersionInfo: "1", TypeUrl: nameTableType, Nonce: "n", Resources: []*anypb.Any{nt}},
		&discoveryv3.DiscoveryResponse{VersionInfo: "2", TypeUrl: proxyConfigType, Nonce: "n", Resources: []*anypb.Any{pc}},
		&discoveryv3.DeltaDiscoveryResponse{SystemVersionInfo: "3", TypeUrl: nameTableType, Nonce: "n",
			Resources: []*discoveryv3.Resource{{Name: "nt", Version: "nt1", Resource: nt}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// FuzzAgentResponse feeds responses of the agent's own types (NDS,
// ProxyConfig) to the handler that consumes them, in both protocols: it
// never panics, and a name table it accepts is published, and kept in the
// cache so that it decodes again the same.
func FuzzAgentResponse(f *testing.F) {
	for _, b := range agentResponses(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		names := &lastNames{}
		s := &Service{cfg: Config{NDS: true, ProxyConfigXDS: true}, log: slog.New(slog.DiscardHandler),
			out: Outputs{Names: names, Anchors: messages.Discard[messages.TrustAnchors]{}}}
		fr := &rawxds.Frame{Body: rawxds.Body{b}}
		if fr.Scan() != nil {
			return // the codec refuses it before any handler
		}
		consumeAll(t, s, names, delta{}.agentResource, fr)
		consumeAll(t, s, names, sotw{}.agentResource, fr)
	})
}

func consumeAll(t *testing.T, s *Service, names *lastNames, agentResource func(*rawxds.Frame) (*anypb.Any, string, error), fr *rawxds.Frame) {
	res, version, err := agentResource(fr)
	if err != nil {
		return
	}
	for _, typeURL := range []string{nameTableType, proxyConfigType} {
		names.set = false
		if err := s.consume(typeURL, res, version); err != nil || typeURL != nameTableType {
			continue
		}
		if !names.set {
			t.Fatal("a name table accepted and not published")
		}
		back, err := decodeNameTable(res.GetValue(), version)
		if err != nil || back.Version != names.last.Version || len(back.Hosts) != len(names.last.Hosts) {
			t.Fatalf("the accepted table does not decode again the same: %v", err)
		}
	}
}

// lastNames keeps the last table sent.
type lastNames struct {
	last messages.NameTable
	set  bool
}

func (l *lastNames) Send(nt messages.NameTable) { l.last, l.set = nt, true }

// FuzzDeltaCache feeds Delta responses, as Envoy would have acknowledged
// them, to the cache, then writes and reads back the cache file: what the
// cache keeps is what the file gives back.
func FuzzDeltaCache(f *testing.F) {
	f.Add(rawxds.DeltaResponse(resource.ClusterType, "3", "n", [][]byte{{0x1a, 0x01, 'a', 0x12, 0x00}}), []byte{0x0a, 0x00})
	f.Add(xdsserver.SotWResponse(f, "v", "n", 2), []byte(nil))
	f.Fuzz(func(t *testing.T, b, table []byte) {
		c := newLKG(1<<40, slog.New(slog.DiscardHandler))
		fr := &rawxds.Frame{Body: rawxds.Body{b}}
		if fr.Scan() != nil {
			return
		}
		c.startDelta(resource.ClusterType, nil)
		c.applyDelta(resource.ClusterType, fr)
		c.putNames(table, "nt")
		snap := c.snapshot()
		h := cacheHeader{nodeID: testNode, address: "istiod:15012", written: time.Unix(1, 0)}
		file := encodeCache(h, snap)
		if got := cacheSize(h, snap); got != int64(len(file)) {
			t.Fatalf("cacheSize %d, file %d bytes", got, len(file))
		}
		h2, back, err := decodeCache(file)
		if err != nil {
			t.Fatalf("the cache file written does not decode: %v", err)
		}
		if h2.nodeID != h.nodeID || back.mode != snap.mode || !bytes.Equal(back.names.b, table) {
			t.Fatalf("read back %+v, %+v; wrote %+v, %+v", h2, back, h, snap)
		}
		for typeURL, d := range snap.delta {
			got := back.delta[typeURL]
			if got.version != d.version || len(got.res) != len(d.res) {
				t.Fatalf("%s read back %d resources at %q, wrote %d at %q", typeURL, len(got.res), got.version, len(d.res), d.version)
			}
			for name, r := range d.res {
				if g := got.res[name]; g.version != r.version || !bytes.Equal(g.b, r.b) {
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
	h := cacheHeader{nodeID: testNode, address: "istiod:15012", written: time.Unix(5, 0)}
	for _, file := range [][]byte{
		encodeCache(h, cacheSnapshot{mode: modeSotW, sotw: map[string]sotwEntry{resource.ClusterType: {b: rawxds.Body{xdsserver.SotWResponse(f, "v1", "n", 2)}, version: "v1"}}}),
		encodeCache(h, cacheSnapshot{mode: modeDelta, delta: map[string]deltaSnapshot{resource.ClusterType: {version: "3", res: map[string]deltaRes{
			"a": {version: "a1", b: []byte{0x1a, 0x01, 'a', 0x0a, 0x02, 'a', '1', 0x12, 0x00}},
		}}}, names: &namesEntry{b: []byte{0x0a, 0x00}, version: "n1"}}),
		encodeCache(h, cacheSnapshot{names: &namesEntry{b: nil, version: ""}}),
	} {
		f.Add(file[len(cacheMagic) : len(file)-checksumSize])
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		_, _, _ = decodeCache(payload)
		file := append([]byte(cacheMagic), payload...)
		file = binary.BigEndian.AppendUint32(file, crc32.Checksum(file, castagnoli))
		h, s, err := decodeCache(file)
		if err != nil {
			return
		}
		h2, s2, err := decodeCache(encodeCache(h, s))
		if err != nil {
			t.Fatalf("a decoded cache written back does not decode: %v", err)
		}
		if h2 != h || s2.mode != s.mode || len(s2.sotw) != len(s.sotw) || len(s2.delta) != len(s.delta) || (s2.names == nil) != (s.names == nil) {
			t.Fatalf("round trip: %+v %+v, want %+v %+v", h2, s2, h, s)
		}
	})
}
