package xdsproxy

import (
	"errors"
	"fmt"
	"strconv"

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

// scan reads the fields the proxy needs. A field repeated later wins, as in
// protobuf: that is how withNonce replaces the nonce without re-encoding.
func (f *frame) scan() error {
	b := f.b
	f.resources = 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %v", errMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		if typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return fmt.Errorf("%w: field %d: %v", errMalformed, num, protowire.ParseError(m))
			}
			switch num {
			case fieldVersion:
				f.version = string(v)
			case fieldResources:
				f.resources++
			case fieldTypeURL:
				f.typeURL = string(v)
			case fieldNonce:
				f.nonce = string(v)
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return fmt.Errorf("%w: field %d: %v", errMalformed, num, protowire.ParseError(m))
		}
		b = b[m:]
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
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return r, fmt.Errorf("%w: resource: %v", errMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType {
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return r, fmt.Errorf("%w: resource field %d: %v", errMalformed, num, protowire.ParseError(m))
			}
			b = b[m:]
			continue
		}
		v, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return r, fmt.Errorf("%w: resource field %d: %v", errMalformed, num, protowire.ParseError(m))
		}
		b = b[m:]
		switch num {
		case fieldResName:
			r.name = string(v)
		case fieldResResourceName:
			if r.name == "" {
				r.name = firstString(v, 1)
			}
		case fieldResVersion:
			r.version = string(v)
		case fieldResResource:
			r.hasBody = true
		case fieldResTTL:
			r.noCache = true
		case fieldResCacheControl:
			// Resource.CacheControl.do_not_cache = 1 (bool).
			if firstVarint(v, 1) != 0 {
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
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return d, fmt.Errorf("%w: %v", errMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType {
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return d, fmt.Errorf("%w: field %d: %v", errMalformed, num, protowire.ParseError(m))
			}
			b = b[m:]
			continue
		}
		v, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return d, fmt.Errorf("%w: field %d: %v", errMalformed, num, protowire.ParseError(m))
		}
		b = b[m:]
		switch num {
		case fieldResources:
			d.resources = append(d.resources, v)
		case fieldRemoved:
			d.removed = append(d.removed, string(v))
		case fieldRemovedNames:
			d.removed = append(d.removed, firstString(v, 1))
		}
	}
	return d, nil
}

// firstString is the string field num of message b ("" if absent or bad).
func firstString(b []byte, num protowire.Number) string {
	var out string
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return out
		}
		b = b[l:]
		m := protowire.ConsumeFieldValue(n, typ, b)
		if m < 0 {
			return out
		}
		if n == num && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			out = string(v)
		}
		b = b[m:]
	}
	return out
}

// firstVarint is the varint field num of message b (0 if absent or bad).
func firstVarint(b []byte, num protowire.Number) uint64 {
	var out uint64
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return out
		}
		b = b[l:]
		m := protowire.ConsumeFieldValue(n, typ, b)
		if m < 0 {
			return out
		}
		if n == num && typ == protowire.VarintType {
			out, _ = protowire.ConsumeVarint(b)
		}
		b = b[m:]
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
	return "meshagent-cache-" + strconv.FormatUint(stream, 10) + "-" + strconv.Itoa(n)
}
