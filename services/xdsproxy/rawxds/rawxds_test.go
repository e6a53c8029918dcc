package rawxds

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// The scan reads what the proxy needs; a nonce appended replaces the old
// one for any decoder, and nothing else changes.
func TestScanAndReplaceNonce(t *testing.T) {
	b := xdsserver.SotWResponse(t, "v7", "upstream-nonce", 3)
	f := Frame{Body: Body{b}}
	if err := f.Scan(); err != nil {
		t.Fatal(err)
	}
	if f.TypeURL != resource.ClusterType || f.Nonce != "upstream-nonce" || f.Version != "v7" || f.Resources != 3 {
		t.Fatalf("scan = %+v", f)
	}
	var orig, got discoveryv3.DiscoveryResponse
	if err := proto.Unmarshal(b, &orig); err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(WithNonce(Body{b}, "mine").Bytes(), &got); err != nil {
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
		f := Frame{Body: Body{bad}}
		if err := f.Scan(); !errors.Is(err, errMalformed) {
			t.Errorf("scan(%x) = %v, want errMalformed", bad, err)
		}
	}
}

// The codec passes frames as bytes, in one piece whatever gRPC's buffers.
func TestRawCodec(t *testing.T) {
	c := NewCodec()
	b := xdsserver.SotWResponse(t, "v1", "n1", 50)
	// gRPC hands a large message over in several buffers.
	var data mem.BufferSlice
	for rest := b; len(rest) > 0; {
		n := min(len(rest), 1000)
		data = append(data, mem.SliceBuffer(rest[:n]))
		rest = rest[n:]
	}
	var f Frame
	if err := c.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if f.Nonce != "n1" || string(f.Body.Bytes()) != string(b) {
		t.Fatalf("unmarshalled %+v", f.Nonce)
	}
	// Held as gRPC's buffers, not a copy of them (#24).
	if len(f.Body) != len(data) || &f.Body[0][0] != &b[0] || &f.Body[len(f.Body)-1][0] != &data[len(data)-1].ReadOnlyData()[0] {
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

// BenchmarkUnmarshalFrame: what receiving a 10,000-cluster push costs the
// codec (#24: a joined copy of 3.7 MB before; gRPC's buffers now).
func BenchmarkUnmarshalFrame(b *testing.B) {
	msg := xdsserver.SotWResponse(b, "v1", "n1", 10000)
	var data mem.BufferSlice
	for _, p := range xdsserver.Pieces(msg, 16<<10) {
		data = append(data, mem.SliceBuffer(p))
	}
	c := NewCodec()
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		var f Frame
		if err := c.Unmarshal(data, &f); err != nil {
			b.Fatal(err)
		}
	}
}

// A response in pieces reads as the same response in one: the scan and
// the Delta split (#24: the frame is no longer joined).
func TestBodyInPieces(t *testing.T) {
	sotwB := xdsserver.SotWResponse(t, "v2", "n2", 300)
	var res [][]byte
	for i := range 300 {
		res = append(res, xdsserver.DeltaResource(t, fmt.Sprintf("c-%d", i), "r1", nil))
	}
	deltaB := DeltaResponse(resource.ClusterType, "7", "n3", res)
	for _, size := range []int{1, 7, 1000, 16 << 10} {
		whole, split := Frame{Body: Body{sotwB}}, Frame{Body: xdsserver.Pieces(sotwB, size)}
		if err := whole.Scan(); err != nil {
			t.Fatal(err)
		}
		if err := split.Scan(); err != nil || split.TypeURL != whole.TypeURL || split.Nonce != "n2" || split.Version != "v2" || split.Resources != 300 {
			t.Fatalf("pieces of %d: scan %+v, %v", size, split, err)
		}
		got, err := SplitDelta(xdsserver.Pieces(deltaB, size), len(res))
		if err != nil || len(got.Resources) != len(res) {
			t.Fatalf("pieces of %d: %d resources, %v", size, len(got.Resources), err)
		}
		for i, r := range got.Resources {
			if !bytes.Equal(r, res[i]) {
				t.Fatalf("pieces of %d: resource %d differs", size, i)
			}
		}
	}
}

// The fuzz targets of the codec, whose input is the control plane's.

// FuzzScan: the scans of a response never panic, whatever the bytes.
func FuzzScan(f *testing.F) {
	f.Add(xdsserver.SotWResponse(f, "v", "n", 1))
	f.Add([]byte{0x0a, 0x00})
	f.Add(DeltaResponse(resource.ClusterType, "3", "n", [][]byte{{0x1a, 0x01, 'a'}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr := Frame{Body: Body{b}}
		_ = fr.Scan()
		_, _ = ScanResource(b)
		_, _ = SplitDelta(Body{b}, 0)
	})
}

// FuzzBodyFields: a message in pieces, wherever they are cut, reads field
// for field as the same message in one slice, and fails where it fails.
func FuzzBodyFields(f *testing.F) {
	f.Add(xdsserver.SotWResponse(f, "v", "n", 3), uint8(5))
	f.Add(DeltaResponse(resource.ClusterType, "3", "n", [][]byte{{0x1a, 0x01, 'a'}}), uint8(1))
	f.Add([]byte{0x0b, 0x10, 0x01, 0x0c, 0x22, 0x01, 'x'}, uint8(2)) // a group, then a string
	f.Add([]byte{0x0b, 0x0b, 0x0c}, uint8(1))                        // a group never ended
	f.Add([]byte("\xf8\xf8\xf8\xf80\xf80"), uint8(0x99))             // a field number past 2^29
	f.Fuzz(func(t *testing.T, b []byte, step uint8) {
		type got struct {
			num protowire.Number
			v   string
		}
		var want, have []got
		var wantErr, haveErr bool
		for fd, err := range Fields(b, protowire.BytesType) {
			if err != nil {
				wantErr = true
				break
			}
			want = append(want, got{fd.Num, string(fd.V)})
		}
		all := func(protowire.Number) bool { return true }
		for fd, err := range bodyFields(xdsserver.Pieces(b, int(step)+1), all) {
			if err != nil {
				haveErr = true
				break
			}
			have = append(have, got{fd.Num, string(fd.V)})
		}
		if wantErr != haveErr || !slices.Equal(want, have) {
			t.Fatalf("in pieces of %d: %v (error %v), in one: %v (error %v)", int(step)+1, have, haveErr, want, wantErr)
		}
	})
}
