package xdsproxy

import (
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// A response from the control plane is forwarded to Envoy as the bytes the
// control plane sent. Istio's proxy decodes every DiscoveryResponse and
// encodes it again for Envoy: for a 10,000-cluster push that is tens of MB
// of allocations and most of the proxy's CPU, for a message it only needs
// the type URL and nonce of. Here, rawCodec hands the bytes over as a frame,
// a scan of the top-level fields (protowire, no allocation per resource)
// reads those two, and only the agent's own types are decoded in full.

// frame is one DiscoveryResponse or DeltaDiscoveryResponse, undecoded.
type frame struct {
	b []byte
	// typeURL, nonce and version (version_info, or system_version_info
	// for Delta) are read from b; resources counts the resources field.
	typeURL   string
	nonce     string
	version   string
	resources int
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

// field is one field of a protobuf message: for a length-delimited field
// v is its content, for any other its encoded value. v is a sub-slice of
// the message, never a copy.
type field struct {
	num protowire.Number
	v   []byte
}

// fields yields the fields of wire type typ of message b, in order, and
// skips the others: every message the proxy reads is read by one scan of
// the fields it knows. A malformed field ends it with an error (and a zero
// field) saying which.
func fields(b []byte, typ protowire.Type) iter.Seq2[field, error] {
	return func(yield func(field, error) bool) {
		for len(b) > 0 {
			num, t, n := protowire.ConsumeTag(b)
			if n < 0 {
				yield(field{}, protowire.ParseError(n))
				return
			}
			b = b[n:]
			m := protowire.ConsumeFieldValue(num, t, b)
			if m < 0 {
				yield(field{}, fmt.Errorf("field %d: %v", num, protowire.ParseError(m)))
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
			if !yield(field{num: num, v: v}, nil) {
				return
			}
		}
	}
}

// scan reads the fields the proxy needs. A field repeated later wins, as in
// protobuf: that is how withNonce replaces the nonce without re-encoding.
func (f *frame) scan() error {
	f.resources = 0
	for fd, err := range fields(f.b, protowire.BytesType) {
		if err != nil {
			return fmt.Errorf("%w: %v", errMalformed, err)
		}
		switch fd.num {
		case fieldVersion:
			f.version = string(fd.v)
		case fieldResources:
			f.resources++
		case fieldTypeURL:
			f.typeURL = string(fd.v)
		case fieldNonce:
			f.nonce = string(fd.v)
		}
	}
	return nil
}

// withNonce returns a copy of the response bytes with its nonce replaced:
// a nonce field appended after the others wins when Envoy decodes it.
func withNonce(b []byte, nonce string) []byte {
	out := make([]byte, 0, len(b)+len(nonce)+8)
	out = append(out, b...)
	out = protowire.AppendTag(out, fieldNonce, protowire.BytesType)
	return protowire.AppendString(out, nonce)
}

// rawCodec is the proxy's gRPC codec on both sides: frames pass as bytes,
// every other message (requests) goes through gRPC's protobuf codec. Its
// name is "proto", so that the content type on the wire stays
// application/grpc+proto, which every control plane accepts.
type rawCodec struct{ proto encoding.CodecV2 }

func newRawCodec() rawCodec { return rawCodec{proto: encoding.GetCodecV2(proto.Name)} }

func (rawCodec) Name() string { return proto.Name }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		// SliceBuffer is not pooled: gRPC's Free of it is a no-op, and the
		// frame's bytes stay valid for the cache.
		return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
	}
	return c.proto.Marshal(v)
}

func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		// One copy out of gRPC's pooled read buffers, which are recycled
		// when this returns; a large message arrives in many of them.
		f.b = data.Materialize()
		return f.scan()
	}
	return c.proto.Unmarshal(data, v)
}

// resourceInfo is what the cache needs of one discovery.v3.Resource of a
// Delta response.
type resourceInfo struct {
	name    string
	version string
	// hasBody: the resource field is set (a resource without it is a TTL
	// heartbeat, which refreshes and does not replace).
	hasBody bool
	// noCache: the resource asks not to be cached (cache_control
	// do_not_cache) or expires (ttl): it is never served from the cache.
	noCache bool
}

// scanResource reads a discovery.v3.Resource's name, version and flags.
func scanResource(b []byte) (resourceInfo, error) {
	var r resourceInfo
	for fd, err := range fields(b, protowire.BytesType) {
		if err != nil {
			return r, fmt.Errorf("%w: resource: %v", errMalformed, err)
		}
		switch fd.num {
		case fieldResName:
			r.name = string(fd.v)
		case fieldResResourceName:
			if r.name == "" {
				r.name = firstString(fd.v, 1)
			}
		case fieldResVersion:
			r.version = string(fd.v)
		case fieldResResource:
			r.hasBody = true
		case fieldResTTL:
			r.noCache = true
		case fieldResCacheControl:
			// Resource.CacheControl.do_not_cache = 1 (bool).
			if firstVarint(fd.v, 1) != 0 {
				r.noCache = true
			}
		}
	}
	if r.name == "" {
		return r, fmt.Errorf("%w: resource without a name", errMalformed)
	}
	return r, nil
}

// deltaParts is a Delta response split into its resources (raw) and
// removals, for the cache. It is read only when Envoy acknowledges the
// response, off the forwarding path.
type deltaParts struct {
	resources [][]byte
	removed   []string
}

func splitDelta(b []byte) (deltaParts, error) {
	var d deltaParts
	for fd, err := range fields(b, protowire.BytesType) {
		if err != nil {
			return d, fmt.Errorf("%w: %v", errMalformed, err)
		}
		switch fd.num {
		case fieldResources:
			d.resources = append(d.resources, fd.v)
		case fieldRemoved:
			d.removed = append(d.removed, string(fd.v))
		case fieldRemovedNames:
			d.removed = append(d.removed, firstString(fd.v, 1))
		}
	}
	return d, nil
}

// firstString is the string field num of message b ("" if absent or bad;
// the last one if repeated, as protobuf reads it).
func firstString(b []byte, num protowire.Number) string {
	return string(fieldValue(b, num, protowire.BytesType))
}

// firstVarint is the varint field num of message b (0 if absent or bad).
func firstVarint(b []byte, num protowire.Number) uint64 {
	v, _ := protowire.ConsumeVarint(fieldValue(b, num, protowire.VarintType))
	return v
}

// fieldValue is the value of field num, of wire type typ, in message b:
// nil if absent, the last one if repeated (as protobuf reads it), and the
// last read before a malformed field ends the scan.
func fieldValue(b []byte, num protowire.Number, typ protowire.Type) []byte {
	var out []byte
	for fd, err := range fields(b, typ) {
		if err != nil {
			break
		}
		if fd.num == num {
			out = fd.v
		}
	}
	return out
}

// deltaResponse builds a DeltaDiscoveryResponse from raw resources, for
// the cache: the resources are copied as they came, never decoded.
func deltaResponse(typeURL, version, nonce string, resources [][]byte) []byte {
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

// cacheNonce is a nonce of the proxy's own, for responses served from the
// cache: it cannot be mistaken for a control plane's.
func cacheNonce(stream uint64, n int) string {
	return cacheNoncePrefix + strconv.FormatUint(stream, 10) + "-" + strconv.Itoa(n)
}

const cacheNoncePrefix = "meshagent-cache-"

// isCacheNonce: nonce is one of cacheNonce's.
func isCacheNonce(nonce string) bool { return strings.HasPrefix(nonce, cacheNoncePrefix) }
