package protocol

import (
	"maps"
	"slices"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
)

// A stream moving from the cache to the control plane (#24; the move is
// package xdsproxy's reattach.go). The proxy opens the upstream stream and
// resubscribes on Envoy's behalf with what Envoy holds, exactly what Envoy
// sends first on a new stream (Envoy's grpc_mux_impl.cc and
// delta_subscription_state.cc):
//
//   - State of the World: per type, in the order Envoy first asked, its
//     last request's resource names and version_info (the version it
//     holds: the one it acknowledged last, or the one the cache sent it
//     still in flight, as for Delta below), no nonce; the node on the
//     first.
//   - Delta: per type, resource_names_subscribe as Envoy subscribed (none
//     for a legacy wildcard, "*" and the names for an explicit one) and
//     initial_resource_versions, the resources Envoy holds: those it came
//     with and those the cache sent it, acknowledged or still in flight
//     (Envoy takes them before anything the control plane sends on the
//     stream; it accepted the same configuration before). istiod counts
//     them as watched and removes, in its first response, those that no
//     longer exist (pilot/pkg/xds/delta.go, pushDeltaXds): left out, they
//     would stay at Envoy.
//
// Envoy's requests that answer a response of the cache, in flight across
// the switch, stay in the proxy unless they change a subscription
// (AfterCache).

// AfterCache: an ACK or NACK of the cache's response stays in the proxy, unless
// Envoy's names changed since its last request upstream; then it goes as
// a request of its own (no nonce: the control plane never sent that one).
func (SotW) AfterCache(req, last *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryRequest, bool) {
	if last != nil && slices.Equal(req.GetResourceNames(), last.GetResourceNames()) {
		return nil, false
	}
	r := proto.Clone(req).(*discoveryv3.DiscoveryRequest)
	r.ResponseNonce, r.ErrorDetail = "", nil
	return r, true
}

// AfterCache: an ACK or NACK of the cache's response stays in the proxy; the
// subscriptions it carries, if any, go as a request of their own.
func (Delta) AfterCache(req, _ *discoveryv3.DeltaDiscoveryRequest) (*discoveryv3.DeltaDiscoveryRequest, bool) {
	if len(req.GetResourceNamesSubscribe()) == 0 && len(req.GetResourceNamesUnsubscribe()) == 0 {
		return nil, false
	}
	r := proto.Clone(req).(*discoveryv3.DeltaDiscoveryRequest)
	r.ResponseNonce, r.ErrorDetail, r.InitialResourceVersions = "", nil, nil
	return r, true
}

// Resubscribe: per type, Envoy's last names and the version it holds
// (Envoy's GrpcMuxImpl keeps both in its request, and clears the nonce on
// a new stream); the node on the first. A response still in flight to
// Envoy counts as held, as in Delta: Envoy takes it before anything the
// control plane sends on the stream, and accepted the same configuration
// before. Declaring only what Envoy had acknowledged made the move's
// version_info depend on whether Envoy's ACK of the cache's response had
// reached the proxy yet, a race of a few ms (the flake of
// TestCachedStreamMovesToControlPlane under load, #36's fifth session).
func (x *sotwTracker) Resubscribe() []*discoveryv3.DiscoveryRequest {
	out := make([]*discoveryv3.DiscoveryRequest, 0, len(x.order))
	for _, t := range x.order {
		version := x.versions[t]
		if c, ok := x.fromCache[t]; ok {
			version = c.version
		} else if p := x.pending[t]; p != nil {
			version = p.Version
		}
		r := &discoveryv3.DiscoveryRequest{TypeUrl: t, ResourceNames: slices.Clone(x.names[t]), VersionInfo: version}
		if len(out) == 0 {
			r.Node = x.first.GetNode()
		}
		out = append(out, r)
	}
	return out
}

// Resubscribe: per type, Envoy's subscriptions and what it holds, as
// DeltaSubscriptionState::getNextRequestAckless builds the first request
// of a stream; a type Envoy subscribed to nothing of is left out (Envoy
// sends nothing for it, and an empty request would be a wildcard). What
// the stream tracks of each type restarts from there: the cache, on the
// first ACK of the control plane's response, keeps what Envoy holds.
func (x *deltaTracker) Resubscribe() []*discoveryv3.DeltaDiscoveryRequest {
	out := make([]*discoveryv3.DeltaDiscoveryRequest, 0, len(x.order))
	for _, t := range x.order {
		sub := x.subs[t]
		names := slices.Sorted(maps.Keys(sub.names))
		if !sub.wildcard && len(names) == 0 {
			continue
		}
		r := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: t}
		if len(names) > 0 {
			if sub.wildcard {
				names = append([]string{"*"}, names...)
			}
			r.ResourceNamesSubscribe = names
		}
		held := make(map[string]string, len(sub.held))
		for n, v := range sub.held {
			if sub.wildcard || sub.names[n] {
				held[n] = v
			}
		}
		if len(held) > 0 {
			r.InitialResourceVersions = maps.Clone(held)
		}
		if len(out) == 0 {
			r.Node = x.first.GetNode()
		}
		out = append(out, r)
		sub.initial, sub.held = held, maps.Clone(held)
		x.started[t] = false
	}
	return out
}
