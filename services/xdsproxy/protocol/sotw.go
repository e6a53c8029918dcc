package protocol

import (
	"slices"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/services/xdsproxy/lkg"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
)

// SotW is the State of the World protocol (ADS's
// StreamAggregatedResources).
type SotW struct{}

// sotwTracker tracks a State of the World stream: per type, the names Envoy
// asked for and the response it has not acknowledged yet. An ACK makes that
// response the type's last-known-good. It has no lock: the proxy's state
// owner keeps it (package xdsproxy's owner.go), and hands it the cache it
// feeds and reads.
type sotwTracker struct {
	id      uint64 // the stream's, for the cache's nonces
	first   *discoveryv3.DiscoveryRequest
	names   map[string][]string      // type → the names of Envoy's latest request
	order   []string                 // types in the order Envoy first asked
	pending map[string]*rawxds.Frame // type → the last response forwarded
	served  map[string][]string      // cache mode: type → names last answered
	nonces  int
	// fromCache: type → the cache's response Envoy has not answered yet,
	// later than any pending one (Sending drops it): Envoy holds its
	// version once it reads it (Resubscribe).
	fromCache map[string]cacheSent

	// versions: type → the version_info of Envoy's latest request, the
	// version it holds (HeldVersion, Resubscribe).
	versions map[string]string
}

func (SotW) NewTracker(id uint64) Tracker[*discoveryv3.DiscoveryRequest] {
	return &sotwTracker{id: id, names: map[string][]string{}, pending: map[string]*rawxds.Frame{}, served: map[string][]string{},
		fromCache: map[string]cacheSent{}, versions: map[string]string{}}
}

func (SotW) Mode() lkg.Mode { return lkg.ModeSotW }
func (SotW) Method() string {
	return discoveryv3.AggregatedDiscoveryService_StreamAggregatedResources_FullMethodName
}

func (SotW) NewRequest() *discoveryv3.DiscoveryRequest { return new(discoveryv3.DiscoveryRequest) }

func (SotW) AgentRequest(typeURL, version, nonce string, detail *rpcstatus.Status) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, VersionInfo: version, ResponseNonce: nonce, ErrorDetail: detail}
}

func (SotW) AgentResource(f *rawxds.Frame) (*anypb.Any, string, error) {
	var r discoveryv3.DiscoveryResponse
	if err := proto.Unmarshal(f.Body.Bytes(), &r); err != nil {
		return nil, f.Version, err
	}
	if len(r.GetResources()) == 0 {
		return nil, r.GetVersionInfo(), ErrEmptyResource
	}
	// Agent types are singletons (Istio's handlers take the first).
	return r.GetResources()[0], r.GetVersionInfo(), nil
}

func (x *sotwTracker) Observe(req *discoveryv3.DiscoveryRequest, record bool, cache *lkg.Cache) ReqInfo {
	if x.first == nil {
		x.first = proto.Clone(req).(*discoveryv3.DiscoveryRequest)
	}
	t := req.GetTypeUrl()
	info := ReqInfo{TypeURL: t, Nack: nackOf(req)}
	if _, ok := x.names[t]; !ok {
		x.order = append(x.order, t)
	}
	x.names[t] = req.GetResourceNames()
	x.versions[t] = req.GetVersionInfo()
	if c, ok := x.fromCache[t]; ok && req.GetResponseNonce() == c.nonce {
		delete(x.fromCache, t)
	}
	if p := x.pending[t]; p != nil && req.GetResponseNonce() != "" && req.GetResponseNonce() == p.Nonce {
		delete(x.pending, t)
		if info.Nack == "" {
			info.Acked, info.Version = true, p.Version
			if record {
				cache.PutSotW(t, p.Body, p.Version)
			}
		}
	}
	return info
}

func (x *sotwTracker) Sending(f *rawxds.Frame, _ *lkg.Cache) {
	x.pending[f.TypeURL] = f
	delete(x.fromCache, f.TypeURL)
}

// cacheSent is a response of the cache on its way to Envoy (fromCache).
type cacheSent struct{ nonce, version string }

func (x *sotwTracker) HeldVersion(typeURL string) string { return x.versions[typeURL] }

// AwaitsAnswer: a wildcard request that acknowledges nothing
// (wildcardFirst).
func (SotW) AwaitsAnswer(req *discoveryv3.DiscoveryRequest) bool {
	return wildcardFirst(req.GetResponseNonce(), req.GetResourceNames())
}

func (x *sotwTracker) ProbeRequest() *discoveryv3.DiscoveryRequest {
	r := proto.Clone(x.first).(*discoveryv3.DiscoveryRequest)
	r.VersionInfo, r.ResponseNonce, r.ErrorDetail = "", "", nil
	return r
}

func (x *sotwTracker) Replay(cache *lkg.Cache) []*rawxds.Frame {
	var out []*rawxds.Frame
	for _, t := range x.order {
		out = append(out, x.answerType(cache, t, x.names[t])...)
	}
	return out
}

// Answer serves a request from the cache, unless it only acknowledges
// what was served (same names).
func (x *sotwTracker) Answer(req *discoveryv3.DiscoveryRequest, cache *lkg.Cache) []*rawxds.Frame {
	t := req.GetTypeUrl()
	if prev, ok := x.served[t]; ok && slices.Equal(prev, req.GetResourceNames()) {
		return nil
	}
	return x.answerType(cache, t, req.GetResourceNames())
}

func (x *sotwTracker) answerType(cache *lkg.Cache, t string, names []string) []*rawxds.Frame {
	if !Forwardable(t) {
		return nil
	}
	e, ok := cache.SotW(t)
	if !ok {
		return nil
	}
	x.served[t] = slices.Clone(names)
	x.nonces++
	nonce := cacheNonce(x.id, x.nonces)
	x.fromCache[t] = cacheSent{nonce: nonce, version: e.Version}
	return []*rawxds.Frame{{Body: rawxds.WithNonce(e.Response, nonce), TypeURL: t, Nonce: nonce, Version: e.Version, Resources: rawxds.CountResources(e.Response)}}
}
