// Package rawxds reads and writes xDS discovery responses without decoding
// them: the XDS proxy's gRPC codec (Codec), the response as gRPC received
// it (Frame, its Body in pieces), the scan of the few fields the proxy
// reads, and the split and the building of a Delta response for the cache.
//
// A response from the control plane is forwarded to Envoy as the bytes the
// control plane sent. Istio's proxy decodes every DiscoveryResponse and
// encodes it again for Envoy: for a 10,000-cluster push that is tens of MB
// of allocations and most of the proxy's CPU, for a message it only needs
// the type URL and nonce of. Here, Codec hands the bytes over as a Frame,
// a scan of the top-level fields (protowire, no allocation per resource)
// reads those two, and only the agent's own types are decoded in full.
//
// Nor are the bytes copied (#24): a frame's body is the payloads of the
// HTTP/2 DATA frames gRPC read them into, in order. Joining them into one
// slice held a second copy of every push at its peak (3.7 MB for 10,000
// clusters), besides the pooled buffers gRPC kept for the next one. The
// body is forwarded to Envoy, kept as the last-known-good configuration and
// written to the cache file as it is.
//
// It owns the wire format of those messages, and nothing else: what the
// proxy does with a response (forwarding, acknowledging, caching) is
// package xdsproxy's, the last-known-good cache and its file are package
// lkg's. It was part of package xdsproxy until #34 split the proxy into
// packages a reader can hold.
package rawxds

import (
	"errors"
	"fmt"
	"iter"
	"slices"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// Frame is one DiscoveryResponse or DeltaDiscoveryResponse, undecoded.
type Frame struct {
	Body Body
	// TypeURL, Nonce and Version (version_info, or system_version_info
	// for Delta) are read from the body; Resources counts the resources
	// field.
	TypeURL   string
	Nonce     string
	Version   string
	Resources int
}

// Field numbers shared by DiscoveryResponse and DeltaDiscoveryResponse
// (envoy/service/discovery/v3/discovery.proto).
const (
	fieldVersion   = 1 // version_info / system_version_info
	fieldResources = 2 // resources
	fieldTypeURL   = 4 // type_url
	fieldNonce     = 5 // nonce
	// Delta only.
	fieldRemoved      = 6 // removed_resources
	fieldRemovedNames = 8 // removed_resource_names
	// discovery.v3.Resource.
	fieldResVersion      = 1 // version
	fieldResResource     = 2 // resource (Any)
	fieldResName         = 3 // name
	fieldResTTL          = 6 // ttl
	fieldResCacheControl = 7 // cache_control
	fieldResResourceName = 8 // resource_name (ResourceName: name = 1)
)

var errMalformed = errors.New("malformed xDS response")

// Field is one Field of a protobuf message: for a length-delimited Field
// V is its content, for any other its encoded value. V is a sub-slice of
// the message, never a copy.
type Field struct {
	Num protowire.Number
	V   []byte
}

// Fields yields the Fields of wire type typ of message b, in order, and
// skips the others: every message the proxy reads is read by one scan of
// the fields it knows. A malformed field ends it with an error (and a zero
// field) saying which.
func Fields(b []byte, typ protowire.Type) iter.Seq2[Field, error] {
	return func(yield func(Field, error) bool) {
		for len(b) > 0 {
			num, t, n := protowire.ConsumeTag(b)
			if n < 0 {
				yield(Field{}, protowire.ParseError(n))
				return
			}
			b = b[n:]
			m := protowire.ConsumeFieldValue(num, t, b)
			if m < 0 {
				yield(Field{}, fmt.Errorf("field %d: %v", num, protowire.ParseError(m)))
				return
			}
			v := b[:m]
			b = b[m:]
			if t != typ {
				continue
			}
			if t == protowire.BytesType {
				v, _ = protowire.ConsumeBytes(v)
			}
			if !yield(Field{Num: num, V: v}, nil) {
				return
			}
		}
	}
}

// Scan reads the fields the proxy needs. A field repeated later wins, as in
// protobuf: that is how WithNonce replaces the nonce without re-encoding.
func (f *Frame) Scan() error {
	f.Resources = 0
	keep := func(n protowire.Number) bool { return n == fieldVersion || n == fieldTypeURL || n == fieldNonce }
	for fd, err := range bodyFields(f.Body, keep) {
		if err != nil {
			return fmt.Errorf("%w: %v", errMalformed, err)
		}
		switch fd.Num {
		case fieldVersion:
			f.Version = string(fd.V)
		case fieldResources:
			f.Resources++
		case fieldTypeURL:
			f.TypeURL = string(fd.V)
		case fieldNonce:
			f.Nonce = string(fd.V)
		}
	}
	return nil
}

// CountResources is the number of resources of a response: what
// /debug/tree shows as sent (#33: a response of the cache counted none,
// and showed "0 resources" until the control plane's next push).
func CountResources(b Body) int {
	n := 0
	for fd, err := range bodyFields(b, func(protowire.Number) bool { return false }) {
		if err != nil {
			break
		}
		if fd.Num == fieldResources {
			n++
		}
	}
	return n
}

// WithNonce returns the response with its nonce replaced: a nonce field
// appended after the others wins when Envoy decodes it. The response's
// pieces are shared, not copied.
func WithNonce(b Body, nonce string) Body {
	tail := protowire.AppendTag(make([]byte, 0, len(nonce)+8), fieldNonce, protowire.BytesType)
	tail = protowire.AppendString(tail, nonce)
	return append(slices.Clip(b), tail)
}

// Codec is the proxy's gRPC codec on both sides: frames pass as bytes,
// every other message (requests) goes through gRPC's protobuf codec. Its
// name is "proto", so that the content type on the wire stays
// application/grpc+proto, which every control plane accepts.
type Codec struct{ proto encoding.CodecV2 }

func NewCodec() Codec { return Codec{proto: encoding.GetCodecV2(proto.Name)} }

func (Codec) Name() string { return proto.Name }

func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*Frame); ok {
		// SliceBuffer is not pooled: gRPC's Free of it is a no-op, and the
		// frame's bytes stay valid for the cache.
		out := make(mem.BufferSlice, len(f.Body))
		for i, p := range f.Body {
			out[i] = mem.SliceBuffer(p)
		}
		return out, nil
	}
	return c.proto.Marshal(v)
}

func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*Frame); ok {
		// The buffers' bytes, not a copy: gRPC frees the buffers when
		// this returns, but on the upstream connection their bytes are
		// not pooled (xdsproxy's upstream.go), so they stay as they are for as long
		// as the frame holds them.
		f.Body = make(Body, len(data))
		for i, buf := range data {
			f.Body[i] = buf.ReadOnlyData()
		}
		return f.Scan()
	}
	return c.proto.Unmarshal(data, v)
}

// ResourceInfo is what the cache needs of one discovery.v3.Resource of a
// Delta response.
type ResourceInfo struct {
	Name    string
	Version string
	// HasBody: the resource field is set (a resource without it is a TTL
	// heartbeat, which refreshes and does not replace).
	HasBody bool
	// NoCache: the resource asks not to be cached (cache_control
	// do_not_cache) or expires (ttl): it is never served from the cache.
	NoCache bool
}

// ScanResource reads a discovery.v3.Resource's name, version and flags.
func ScanResource(b []byte) (ResourceInfo, error) {
	var r ResourceInfo
	for fd, err := range Fields(b, protowire.BytesType) {
		if err != nil {
			return r, fmt.Errorf("%w: resource: %v", errMalformed, err)
		}
		switch fd.Num {
		case fieldResName:
			r.Name = string(fd.V)
		case fieldResResourceName:
			if r.Name == "" {
				r.Name = FirstString(fd.V, 1)
			}
		case fieldResVersion:
			r.Version = string(fd.V)
		case fieldResResource:
			r.HasBody = true
		case fieldResTTL:
			r.NoCache = true
		case fieldResCacheControl:
			// Resource.CacheControl.do_not_cache = 1 (bool).
			if FirstVarint(fd.V, 1) != 0 {
				r.NoCache = true
			}
		}
	}
	if r.Name == "" {
		return r, fmt.Errorf("%w: resource without a name", errMalformed)
	}
	return r, nil
}

// DeltaParts is a Delta response split into its resources (raw) and
// removals, for the cache. It is read only when Envoy acknowledges the
// response, off the forwarding path.
type DeltaParts struct {
	Resources [][]byte
	Removed   []string
}

// SplitDelta splits a Delta response's body. resources is how many it
// holds (Frame.Resources), if known: the slice is made once, not grown.
func SplitDelta(b Body, resources int) (DeltaParts, error) {
	d := DeltaParts{Resources: make([][]byte, 0, resources)}
	keep := func(n protowire.Number) bool {
		return n == fieldResources || n == fieldRemoved || n == fieldRemovedNames
	}
	for fd, err := range bodyFields(b, keep) {
		if err != nil {
			return d, fmt.Errorf("%w: %v", errMalformed, err)
		}
		switch fd.Num {
		case fieldResources:
			d.Resources = append(d.Resources, fd.V)
		case fieldRemoved:
			d.Removed = append(d.Removed, string(fd.V))
		case fieldRemovedNames:
			d.Removed = append(d.Removed, FirstString(fd.V, 1))
		}
	}
	return d, nil
}

// FirstString is the string field num of message b ("" if absent or bad;
// the last one if repeated, as protobuf reads it).
func FirstString(b []byte, num protowire.Number) string {
	return string(fieldValue(b, num, protowire.BytesType))
}

// FirstVarint is the varint field num of message b (0 if absent or bad).
func FirstVarint(b []byte, num protowire.Number) uint64 {
	v, _ := protowire.ConsumeVarint(fieldValue(b, num, protowire.VarintType))
	return v
}

// fieldValue is the value of field num, of wire type typ, in message b:
// nil if absent, the last one if repeated (as protobuf reads it), and the
// last read before a malformed field ends the scan.
func fieldValue(b []byte, num protowire.Number, typ protowire.Type) []byte {
	var out []byte
	for fd, err := range Fields(b, typ) {
		if err != nil {
			break
		}
		if fd.Num == num {
			out = fd.V
		}
	}
	return out
}

// DeltaResponse builds a DeltaDiscoveryResponse from raw resources, for
// the cache: the resources are copied as they came, never decoded.
func DeltaResponse(typeURL, version, nonce string, resources [][]byte) []byte {
	size := len(typeURL) + len(version) + len(nonce) + 16
	for _, r := range resources {
		size += len(r) + 6
	}
	out := make([]byte, 0, size)
	out = protowire.AppendTag(out, fieldVersion, protowire.BytesType)
	out = protowire.AppendString(out, version)
	for _, r := range resources {
		out = protowire.AppendTag(out, fieldResources, protowire.BytesType)
		out = protowire.AppendBytes(out, r)
	}
	out = protowire.AppendTag(out, fieldTypeURL, protowire.BytesType)
	out = protowire.AppendString(out, typeURL)
	out = protowire.AppendTag(out, fieldNonce, protowire.BytesType)
	return protowire.AppendString(out, nonce)
}
