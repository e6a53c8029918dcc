package xdsproxy

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/services/xdsproxy/protocol"
	"github.com/meshagent/meshagent/services/xdsproxy/stallwatch"
)

// Moving a stream from the cache to the control plane (#24). When the probe
// finds the control plane back while the cache serves Envoy, the stream is
// not ended (Envoy would wait out a retry, up to 500 ms of its jittered
// backoff, before it resynchronised): the proxy opens the upstream stream
// on the probe's connection and resubscribes on Envoy's behalf with what
// Envoy holds, exactly what Envoy sends first on a new stream (the stream's
// Tracker.Resubscribe: package protocol's resubscribe.go says what that is
// per protocol), then the agent's own subscriptions (NDS, ProxyConfig, the
// last health) as on any new upstream stream. From then on the stream is
// live: Envoy's requests that the resubscription covers are dropped, and
// those that answer a response of the cache (in flight across the switch)
// stay here unless they change a subscription (Protocol.AfterCache). If the
// switch fails (the upstream cannot be opened, or fails before answering),
// Envoy's stream ends as before the switch existed, with Unavailable.

// resumption is what a stream sends first on the upstream it moves to,
// and which queued requests that covers.
type resumption[R protocol.Request] struct {
	reqs []outgoing[R]
	// envoySeq, agentSeq: the last of Envoy's requests, and of the agent's,
	// that reqs account for (outgoing.seq).
	envoySeq, agentSeq uint64
	// last is Envoy's last request sent upstream, by type (AfterCache).
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
		for _, r := range st.owned.tr.Resubscribe() {
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
// AfterCache makes of a request that answers the cache.
func (r *resumption[R]) pass(pr protocol.Protocol[R], o outgoing[R]) (outgoing[R], bool) {
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
	if protocol.IsCacheNonce(o.req.GetResponseNonce()) {
		req, ok := pr.AfterCache(o.req, r.last[t])
		if !ok {
			return o, false
		}
		o.req = req
	}
	r.last[t] = o.req
	return o, true
}
