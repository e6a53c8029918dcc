package protocol

import (
	"maps"
	"sort"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/services/xdsproxy/lkg"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
)

// maxPendingDelta bounds the Delta responses awaiting Envoy's ACK per
// type. Envoy ACKs each in turn; past this, the type's cached set cannot
// be kept exact and is marked incomplete.
const maxPendingDelta = 64

// deltaSub is what Envoy subscribed to for one type.
type deltaSub struct {
	wildcard bool
	names    map[string]bool
	// initial is what Envoy said it had when it first asked
	// (initial_resource_versions).
	initial map[string]string
	// held is what Envoy holds while the cache serves it: initial, and
	// the resources of the cache's responses (Resubscribe).
	held map[string]string
}

// Delta is the Delta protocol (ADS's DeltaAggregatedResources).
type Delta struct{}

// deltaTracker tracks a Delta stream: subscriptions, and the responses
// forwarded and not acknowledged yet. Each ACK applies its response to the
// type's cached resource set. It has no lock: the proxy's state owner keeps
// it (package xdsproxy's owner.go), and hands it the cache it feeds and
// reads.
type deltaTracker struct {
	id      uint64 // the stream's, for the cache's nonces
	record  bool
	first   *discoveryv3.DeltaDiscoveryRequest
	subs    map[string]*deltaSub
	order   []string
	pending map[string][]*rawxds.Frame
	started map[string]bool // the cache was aligned with Envoy for this type
	served  map[string]bool // cache mode: types answered
	nonces  int
}

func (Delta) NewTracker(id uint64) Tracker[*discoveryv3.DeltaDiscoveryRequest] {
	return &deltaTracker{id: id, subs: map[string]*deltaSub{}, pending: map[string][]*rawxds.Frame{},
		started: map[string]bool{}, served: map[string]bool{}}
}

func (Delta) Mode() lkg.Mode { return lkg.ModeDelta }
func (Delta) Method() string {
	return discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResources_FullMethodName
}

func (Delta) NewRequest() *discoveryv3.DeltaDiscoveryRequest {
	return new(discoveryv3.DeltaDiscoveryRequest)
}

// AgentRequest has no version: a Delta request carries none.
func (Delta) AgentRequest(typeURL, _, nonce string, detail *rpcstatus.Status) *discoveryv3.DeltaDiscoveryRequest {
	return &discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: nonce, ErrorDetail: detail}
}

func (Delta) AgentResource(f *rawxds.Frame) (*anypb.Any, string, error) {
	var r discoveryv3.DeltaDiscoveryResponse
	if err := proto.Unmarshal(f.Body.Bytes(), &r); err != nil {
		return nil, f.Version, err
	}
	if len(r.GetResources()) == 0 {
		return nil, r.GetSystemVersionInfo(), ErrEmptyResource
	}
	res := r.GetResources()[0]
	version := res.GetVersion()
	if version == "" {
		version = r.GetSystemVersionInfo()
	}
	return res.GetResource(), version, nil
}

func (x *deltaTracker) Observe(req *discoveryv3.DeltaDiscoveryRequest, record bool, cache *lkg.Cache) ReqInfo {
	if x.first == nil {
		x.first = proto.Clone(req).(*discoveryv3.DeltaDiscoveryRequest)
		x.record = record
	}
	t := req.GetTypeUrl()
	info := ReqInfo{TypeURL: t, Nack: nackOf(req)}
	sub := x.subs[t]
	if sub == nil {
		sub = &deltaSub{names: map[string]bool{}, initial: maps.Clone(req.GetInitialResourceVersions())}
		sub.held = maps.Clone(sub.initial)
		if sub.held == nil {
			sub.held = map[string]string{}
		}
		// A first request naming nothing is a (legacy) wildcard. What
		// Envoy holds of a wildcard was not asked for by name: names are
		// its subscriptions only (a new stream names them again).
		sub.wildcard = len(req.GetResourceNamesSubscribe()) == 0
		if !sub.wildcard {
			for n := range sub.initial {
				sub.names[n] = true
			}
		}
		x.subs[t] = sub
		x.order = append(x.order, t)
	}
	for _, n := range req.GetResourceNamesSubscribe() {
		if n == "*" {
			sub.wildcard = true
		} else {
			sub.names[n] = true
		}
	}
	for _, n := range req.GetResourceNamesUnsubscribe() {
		if n == "*" {
			sub.wildcard = false
		} else {
			delete(sub.names, n)
		}
	}
	nonce := req.GetResponseNonce()
	if nonce == "" {
		return info
	}
	list := x.pending[t]
	for i, f := range list {
		if f.Nonce != nonce {
			continue
		}
		// The frames up to this one leave the list and its array: the
		// array outlives a re-slice, and a frame held there would keep
		// its whole response alive past the next push (#24).
		clear(list[:i+1])
		x.pending[t] = list[i+1:]
		if info.Nack == "" {
			info.Acked, info.Version = true, f.Version
			if record {
				if !x.started[t] {
					x.started[t] = true
					cache.StartDelta(t, sub.initial)
				}
				cache.ApplyDelta(t, f)
			}
		}
		break
	}
	return info
}

func (x *deltaTracker) Sending(f *rawxds.Frame, cache *lkg.Cache) {
	list := append(x.pending[f.TypeURL], f)
	if len(list) > maxPendingDelta {
		list[0] = nil
		list = list[1:]
		if x.record {
			cache.DropDelta(f.TypeURL, "Envoy left too many responses unacknowledged")
		}
	}
	x.pending[f.TypeURL] = list
}

// HeldVersion: a Delta request says no version.
func (x *deltaTracker) HeldVersion(string) string { return "" }

// AwaitsAnswer: a wildcard subscription that acknowledges nothing
// (wildcardFirst).
func (Delta) AwaitsAnswer(req *discoveryv3.DeltaDiscoveryRequest) bool {
	return wildcardFirst(req.GetResponseNonce(), req.GetResourceNamesSubscribe())
}

func (x *deltaTracker) ProbeRequest() *discoveryv3.DeltaDiscoveryRequest {
	r := proto.Clone(x.first).(*discoveryv3.DeltaDiscoveryRequest)
	// A fresh subscription: a control plane answers it even when nothing
	// changed.
	r.InitialResourceVersions, r.ResponseNonce, r.ErrorDetail = nil, "", nil
	return r
}

func (x *deltaTracker) Replay(cache *lkg.Cache) []*rawxds.Frame {
	var out []*rawxds.Frame
	for _, t := range x.order {
		out = append(out, x.answerFirst(cache, t)...)
	}
	return out
}

// Answer serves a request from the cache: the whole subscription the
// first time a type is asked for, then what each new subscription adds.
// ACKs and NACKs of what was served are consumed.
func (x *deltaTracker) Answer(req *discoveryv3.DeltaDiscoveryRequest, cache *lkg.Cache) []*rawxds.Frame {
	t := req.GetTypeUrl()
	if !x.served[t] {
		return x.answerFirst(cache, t)
	}
	if len(req.GetResourceNamesSubscribe()) == 0 || !Forwardable(t) {
		return nil
	}
	res, version, ok := cache.Delta(t)
	if !ok {
		return nil
	}
	var names []string
	for _, n := range req.GetResourceNamesSubscribe() {
		if _, ok := res[n]; ok {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil
	}
	return []*rawxds.Frame{x.cachedFrame(t, version, res, names)}
}

func (x *deltaTracker) answerFirst(cache *lkg.Cache, t string) []*rawxds.Frame {
	sub := x.subs[t]
	if sub == nil || !Forwardable(t) {
		return nil
	}
	res, version, ok := cache.Delta(t)
	if !ok {
		return nil
	}
	x.served[t] = true
	names := make([]string, 0, len(res))
	for n, r := range res {
		if (sub.wildcard || sub.names[n]) && sub.initial[n] != r.Version {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	// Sent even when empty: Envoy waits for a first answer per type
	// before it finishes initialising.
	return []*rawxds.Frame{x.cachedFrame(t, version, res, names)}
}

// cachedFrame is the cache's response of type t with the resources names
// of res, which Envoy holds from then on (deltaSub.held).
func (x *deltaTracker) cachedFrame(t, version string, res map[string]lkg.DeltaRes, names []string) *rawxds.Frame {
	x.nonces++
	nonce := cacheNonce(x.id, x.nonces)
	pick := make([][]byte, 0, len(names))
	sub := x.subs[t]
	for _, n := range names {
		pick = append(pick, res[n].Resource)
		sub.held[n] = res[n].Version
	}
	return &rawxds.Frame{Body: rawxds.Body{rawxds.DeltaResponse(t, version, nonce, pick)}, TypeURL: t, Nonce: nonce, Version: version, Resources: len(pick)}
}
