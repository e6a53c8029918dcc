package xdsproxy

import (
	"slices"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// sotw is the State of the World protocol (ADS's
// StreamAggregatedResources).
type sotw struct{}

// sotwTracker tracks a State of the World stream: per type, the names Envoy
// asked for and the response it has not acknowledged yet. An ACK makes that
// response the type's last-known-good. It has no lock: the proxy's state
// owner keeps it (owner.go), and hands it the cache it feeds and reads.
type sotwTracker struct {
	id      uint64 // the stream's, for the cache's nonces
	first   *discoveryv3.DiscoveryRequest
	names   map[string][]string // type → the names of Envoy's latest request
	order   []string            // types in the order Envoy first asked
	pending map[string]*frame   // type → the last response forwarded
	served  map[string][]string // cache mode: type → names last answered
	nonces  int

	// versions: type → the version_info of Envoy's latest request, the
	// version it holds (reattach.go).
	versions map[string]string
}

func (sotw) newTracker(id uint64) tracker[*discoveryv3.DiscoveryRequest] {
	return &sotwTracker{id: id, names: map[string][]string{}, pending: map[string]*frame{}, served: map[string][]string{},
		versions: map[string]string{}}
}

func (sotw) mode() cacheMode { return modeSotW }
func (sotw) method() string  { return methodSotW }

func (sotw) newRequest() *discoveryv3.DiscoveryRequest { return new(discoveryv3.DiscoveryRequest) }

func (sotw) agentRequest(typeURL, version, nonce string, detail *rpcstatus.Status) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, VersionInfo: version, ResponseNonce: nonce, ErrorDetail: detail}
}

func (sotw) agentResource(f *frame) (*anypb.Any, string, error) {
	var r discoveryv3.DiscoveryResponse
	if err := proto.Unmarshal(f.body.bytes(), &r); err != nil {
		return nil, f.version, err
	}
	if len(r.GetResources()) == 0 {
		return nil, r.GetVersionInfo(), errEmptyResource
	}
	// Agent types are singletons (Istio's handlers take the first).
	return r.GetResources()[0], r.GetVersionInfo(), nil
}

func (x *sotwTracker) observe(req *discoveryv3.DiscoveryRequest, record bool, cache *lkg) reqInfo {
	if x.first == nil {
		x.first = proto.Clone(req).(*discoveryv3.DiscoveryRequest)
	}
	t := req.GetTypeUrl()
	info := reqInfo{typeURL: t, nack: nackOf(req)}
	if _, ok := x.names[t]; !ok {
		x.order = append(x.order, t)
	}
	x.names[t] = req.GetResourceNames()
	x.versions[t] = req.GetVersionInfo()
	if p := x.pending[t]; p != nil && req.GetResponseNonce() != "" && req.GetResponseNonce() == p.nonce {
		delete(x.pending, t)
		if info.nack == "" {
			info.acked, info.version = true, p.version
			if record {
				cache.putSotW(t, p.body, p.version)
			}
		}
	}
	return info
}

func (x *sotwTracker) sending(f *frame, _ *lkg) {
	x.pending[f.typeURL] = f
}

// awaitsAnswer: a wildcard request that acknowledges nothing
// (wildcardFirst).
func (sotw) awaitsAnswer(req *discoveryv3.DiscoveryRequest) bool {
	return wildcardFirst(req.GetResponseNonce(), req.GetResourceNames())
}

func (x *sotwTracker) probeRequest() *discoveryv3.DiscoveryRequest {
	r := proto.Clone(x.first).(*discoveryv3.DiscoveryRequest)
	r.VersionInfo, r.ResponseNonce, r.ErrorDetail = "", "", nil
	return r
}

func (x *sotwTracker) replay(cache *lkg) []*frame {
	var out []*frame
	for _, t := range x.order {
		out = append(out, x.answerType(cache, t, x.names[t])...)
	}
	return out
}

// answer serves a request from the cache, unless it only acknowledges
// what was served (same names).
func (x *sotwTracker) answer(req *discoveryv3.DiscoveryRequest, cache *lkg) []*frame {
	t := req.GetTypeUrl()
	if prev, ok := x.served[t]; ok && slices.Equal(prev, req.GetResourceNames()) {
		return nil
	}
	return x.answerType(cache, t, req.GetResourceNames())
}

func (x *sotwTracker) answerType(cache *lkg, t string, names []string) []*frame {
	if !forwardable(t) {
		return nil
	}
	e, ok := cache.getSotW(t)
	if !ok {
		return nil
	}
	x.served[t] = slices.Clone(names)
	x.nonces++
	nonce := cacheNonce(x.id, x.nonces)
	return []*frame{{body: withNonce(e.b, nonce), typeURL: t, nonce: nonce, version: e.version, resources: countResources(e.b)}}
}

// countResources is the number of resources of a response: what
// /debug/tree shows as sent (#33: a response of the cache counted none,
// and showed "0 resources" until the control plane's next push).
func countResources(b body) int {
	n := 0
	for fd, err := range bodyFields(b, func(protowire.Number) bool { return false }) {
		if err != nil {
			break
		}
		if fd.num == fieldResources {
			n++
		}
	}
	return n
}
