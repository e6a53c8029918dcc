package xdsproxy

import (
	"maps"
	"slices"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/services/xdsproxy/stallwatch"
)

// Moving a stream from the cache to the control plane (#24). When the probe
// finds the control plane back while the cache serves Envoy, the stream is
// not ended (Envoy would wait out a retry, up to 500 ms of its jittered
// backoff, before it resynchronised): the proxy opens the upstream stream
// on the probe's connection and resubscribes on Envoy's behalf with what
// Envoy holds, exactly what Envoy sends first on a new stream (Envoy's
// grpc_mux_impl.cc and delta_subscription_state.cc):
//
//   - State of the World: per type, in the order Envoy first asked, its
//     last request's resource names and version_info (the version it
//     holds), no nonce; the node on the first.
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
// then the agent's own subscriptions (NDS, ProxyConfig, the last health)
// as on any new upstream stream. From then on the stream is live: Envoy's
// requests that the resubscription covers are dropped, and those that
// answer a response of the cache (in flight across the switch) stay here
// unless they change a subscription (afterCache). If the switch fails (the
// upstream cannot be opened, or fails before answering), Envoy's stream
// ends as before the switch existed, with Unavailable.

// resumption is what a stream sends first on the upstream it moves to,
// and which queued requests that covers.
type resumption[R request] struct {
	reqs []outgoing[R]
	// envoySeq, agentSeq: the last of Envoy's requests, and of the agent's,
	// that reqs account for (outgoing.seq).
	envoySeq, agentSeq uint64
	// last is Envoy's last request sent upstream, by type (afterCache).
	last map[string]R
}

// reattach moves the stream, served from the cache, to the control plane
// that the probe found back, and proxies it live.
func (st *stream[R]) reattach() error {
	up, err := st.dial()
	if err != nil {
		return st.reattachFailed(err)
	}
	res := st.resume()
	st.log.Info("control plane reachable again: Envoy's stream continues on it",
		"address", st.svc.cfg.DiscoveryAddress, "resubscribed", len(res.reqs))
	return st.finish(st.live(up, res), true)
}

// reattachFailed ends Envoy's stream when the control plane failed again
// as the stream moved to it: Envoy reconnects, and its next stream finds
// the control plane or the cache.
func (st *stream[R]) reattachFailed(err error) error {
	s := st.svc
	st.log.Warn("control plane failed again as Envoy's stream moved to it; ending Envoy's stream so that it reconnects",
		"address", s.cfg.DiscoveryAddress, "error", s.cfg.describe(err))
	st.own.failed(err, false)
	return status.Errorf(codes.Unavailable,
		"control plane %s failed as this stream moved to it from the agent's cache: reconnect (%s)", s.cfg.DiscoveryAddress, s.cfg.describe(err))
}

// resume is the resubscription, taken from the stream's state as the
// owner has it: every request the owner observed or queued so far is
// accounted for. The stall watch starts afresh: what the failed upstream
// left waiting is nothing the new one was asked.
func (st *stream[R]) resume() *resumption[R] {
	now := st.own.clock.Now()
	res := &resumption[R]{last: map[string]R{}}
	st.own.ask(func(s *proxyState) {
		for _, r := range st.owned.tr.resubscribe() {
			res.reqs = append(res.reqs, outgoing[R]{req: r})
			res.last[r.GetTypeUrl()] = r
		}
		if st.owned.initialSent {
			for _, r := range st.initialRequests(s) {
				res.reqs = append(res.reqs, outgoing[R]{req: r, agent: true})
			}
		}
		res.envoySeq, res.agentSeq = st.owned.observedSeq, st.owned.agentSeq
		st.owned.stall = stallwatch.NewWatch(st.svc.cfg.StallTimeout, now)
	})
	return res
}

// pass is what the sender does with queued request o after the switch:
// drop it (false) when the resubscription covers it, or send what
// afterCache makes of a request that answers the cache.
func (r *resumption[R]) pass(pr protocol[R], o outgoing[R]) (outgoing[R], bool) {
	upTo := r.envoySeq
	if o.agent {
		upTo = r.agentSeq
	}
	if o.seq != 0 && o.seq <= upTo {
		return o, false
	}
	if o.agent {
		return o, true
	}
	t := o.req.GetTypeUrl()
	if isCacheNonce(o.req.GetResponseNonce()) {
		req, ok := pr.afterCache(o.req, r.last[t])
		if !ok {
			return o, false
		}
		o.req = req
	}
	r.last[t] = o.req
	return o, true
}

// afterCache: an ACK or NACK of the cache's response stays here, unless
// Envoy's names changed since its last request upstream; then it goes as
// a request of its own (no nonce: the control plane never sent that one).
func (sotw) afterCache(req, last *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryRequest, bool) {
	if last != nil && slices.Equal(req.GetResourceNames(), last.GetResourceNames()) {
		return nil, false
	}
	r := proto.Clone(req).(*discoveryv3.DiscoveryRequest)
	r.ResponseNonce, r.ErrorDetail = "", nil
	return r, true
}

// afterCache: an ACK or NACK of the cache's response stays here; the
// subscriptions it carries, if any, go as a request of their own.
func (delta) afterCache(req, _ *discoveryv3.DeltaDiscoveryRequest) (*discoveryv3.DeltaDiscoveryRequest, bool) {
	if len(req.GetResourceNamesSubscribe()) == 0 && len(req.GetResourceNamesUnsubscribe()) == 0 {
		return nil, false
	}
	r := proto.Clone(req).(*discoveryv3.DeltaDiscoveryRequest)
	r.ResponseNonce, r.ErrorDetail, r.InitialResourceVersions = "", nil, nil
	return r, true
}

// resubscribe: per type, Envoy's last names and the version it holds
// (Envoy's GrpcMuxImpl keeps both in its request, and clears the nonce on
// a new stream); the node on the first.
func (x *sotwTracker) resubscribe() []*discoveryv3.DiscoveryRequest {
	out := make([]*discoveryv3.DiscoveryRequest, 0, len(x.order))
	for _, t := range x.order {
		r := &discoveryv3.DiscoveryRequest{TypeUrl: t, ResourceNames: slices.Clone(x.names[t]), VersionInfo: x.versions[t]}
		if len(out) == 0 {
			r.Node = x.first.GetNode()
		}
		out = append(out, r)
	}
	return out
}

// resubscribe: per type, Envoy's subscriptions and what it holds, as
// DeltaSubscriptionState::getNextRequestAckless builds the first request
// of a stream; a type Envoy subscribed to nothing of is left out (Envoy
// sends nothing for it, and an empty request would be a wildcard). What
// the stream tracks of each type restarts from there: the cache, on the
// first ACK of the control plane's response, keeps what Envoy holds.
func (x *deltaTracker) resubscribe() []*discoveryv3.DeltaDiscoveryRequest {
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
