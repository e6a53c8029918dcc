package xdsproxy

import (
	"slices"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/services/xdsproxy/lkg"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
)

// What differs between State of the World (sotw.go) and Delta (delta.go):
// the stateless protocol a stream speaks, and the tracker of what it
// learned, which the proxy's state owner keeps (owner.go).

// request is Envoy's request in either protocol.
type request interface {
	*discoveryv3.DiscoveryRequest | *discoveryv3.DeltaDiscoveryRequest
	proto.Message
	GetTypeUrl() string
	GetResponseNonce() string
	GetErrorDetail() *rpcstatus.Status
	GetNode() *corev3.Node
}

// nackOf is the message of a request's error_detail, which makes it a
// NACK: never empty then, so that "" means no NACK.
func nackOf[R request](req R) string {
	d := req.GetErrorDetail()
	if d == nil {
		return ""
	}
	if d.GetMessage() == "" {
		return "rejected without a message"
	}
	return d.GetMessage()
}

// internalError is the error_detail of the agent's own requests (a NACK
// of an agent type, Istio's report of an unhealthy workload): code
// Internal, as Istio's agent sends.
func internalError(msg string) *rpcstatus.Status {
	return &rpcstatus.Status{Code: int32(codes.Internal), Message: msg}
}

// reqInfo is what the proxy learns from one of Envoy's requests.
type reqInfo struct {
	typeURL string
	// acked: it acknowledges a response forwarded on this stream, whose
	// version is version.
	acked   bool
	version string
	// nack is the error_detail's message when Envoy rejected a response.
	nack string
}

// protocol is what differs between State of the World (sotw.go) and Delta
// (delta.go), apart from what a stream tracks (tracker). It holds no state.
type protocol[R request] interface {
	mode() lkg.Mode
	method() string
	// newTracker makes the tracker of stream id.
	newTracker(id uint64) tracker[R]
	newRequest() R
	// agentRequest is a request of the agent's own: a subscription, an
	// ACK or NACK of an agent type (consumeAgent), a health report
	// (healthRequest). version is the one the agent last accepted, sent
	// where the protocol has one.
	agentRequest(typeURL, version, nonce string, detail *rpcstatus.Status) R
	// agentResource decodes a response of an agent type: its first
	// resource and version (errEmptyResource when it has none).
	agentResource(f *rawxds.Frame) (*anypb.Any, string, error)
	// awaitsAnswer: a control plane must answer req (the stall rule).
	awaitsAnswer(req R) bool
	// afterCache is what reaches the control plane of Envoy's request req,
	// which answers a response of the cache's, on a stream that moved to
	// the control plane (reattach.go); last is Envoy's last request of
	// that type sent upstream (nil if none). false: nothing.
	afterCache(req, last R) (R, bool)
}

// wildcardFirst is the stall rule's request in either protocol: it
// acknowledges nothing (no nonce) and is a wildcard subscription (no
// names, or "*" among them). Istio's control plane answers every such
// request on a new stream, whatever version Envoy holds; a request naming
// resources may go unanswered when they do not exist.
func wildcardFirst(nonce string, names []string) bool {
	return nonce == "" && (len(names) == 0 || slices.Contains(names, "*"))
}

// tracker is what a stream of one protocol learns of Envoy's requests and
// of the responses sent to it. Part of the proxy's state: only its owner
// calls it (owner.go), and hands it the cache.
type tracker[R request] interface {
	// observe tracks Envoy's subscriptions and ACKs (feeding the cache when
	// record is set); sending tracks a response about to reach Envoy.
	observe(req R, record bool, cache *lkg.Cache) reqInfo
	sending(f *rawxds.Frame, cache *lkg.Cache)
	// probeRequest is Envoy's first request, as a fresh subscription.
	probeRequest() R
	// replay answers, from the cache, every type Envoy asked for so far;
	// answer answers one more request.
	replay(cache *lkg.Cache) []*rawxds.Frame
	answer(req R, cache *lkg.Cache) []*rawxds.Frame
	// resubscribe is what Envoy would send first on a new stream, holding
	// what it was sent on this one: the stream moves from the cache to
	// the control plane (reattach.go).
	resubscribe() []R
}
