// Package protocol is what the XDS proxy knows of the two ADS protocols,
// State of the World (SotW: StreamAggregatedResources) and Delta (Delta:
// DeltaAggregatedResources), and of what one stream of either has carried.
//
// It owns what differs between the two (Protocol, which holds no state: the
// gRPC method, the agent's own requests, which requests a control plane
// must answer), and what a stream has learned (Tracker): per type, what
// Envoy subscribed to, what it was sent and has not acknowledged yet, and
// what it holds. From that a Tracker answers Envoy from the last-known-good
// cache, with nonces of its own (IsCacheNonce), and says how a new upstream
// stream is resubscribed on Envoy's behalf when a stream the cache served
// moves to the control plane (resubscribe.go, #24).
//
// It does not own the proxy's state, its goroutines or the cache: a Tracker
// has no lock, only the proxy's state owner calls it (package xdsproxy's
// owner.go), and it feeds and reads the cache it is handed (package lkg).
// Nor does it send or receive anything: the proxy's stream does. It was
// part of package xdsproxy until #34 split the proxy into packages a reader
// can hold.
package protocol

import (
	"errors"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/services/xdsproxy/lkg"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
)

// Request is Envoy's request in either protocol.
type Request interface {
	*discoveryv3.DiscoveryRequest | *discoveryv3.DeltaDiscoveryRequest
	proto.Message
	GetTypeUrl() string
	GetResponseNonce() string
	GetErrorDetail() *rpcstatus.Status
	GetNode() *corev3.Node
}

// Protocol is what differs between State of the World (sotw.go) and Delta
// (delta.go), apart from what a stream tracks (Tracker). It holds no state.
type Protocol[R Request] interface {
	Mode() lkg.Mode
	// Method is the ADS method's full gRPC name.
	Method() string
	// NewTracker makes the tracker of stream id.
	NewTracker(id uint64) Tracker[R]
	NewRequest() R
	// AgentRequest is a request of the agent's own: a subscription, an
	// ACK or NACK of an agent type, a health report. version is the one
	// the agent last accepted, sent where the protocol has one.
	AgentRequest(typeURL, version, nonce string, detail *rpcstatus.Status) R
	// AgentResource decodes a response of an agent type: its first
	// resource and version (ErrEmptyResource when it has none).
	AgentResource(f *rawxds.Frame) (*anypb.Any, string, error)
	// AwaitsAnswer: a control plane must answer req (the stall rule).
	AwaitsAnswer(req R) bool
	// AfterCache is what reaches the control plane of Envoy's request req,
	// which answers a response of the cache's, on a stream that moved to
	// the control plane (resubscribe.go); last is Envoy's last request of
	// that type sent upstream (nil if none). false: nothing.
	AfterCache(req, last R) (R, bool)
}

// Tracker is what a stream of one protocol learns of Envoy's requests and
// of the responses sent to it. Part of the proxy's state: only its owner
// calls it, and hands it the cache.
type Tracker[R Request] interface {
	// Observe tracks Envoy's subscriptions and ACKs (feeding the cache when
	// record is set); Sending tracks a response about to reach Envoy.
	Observe(req R, record bool, cache *lkg.Cache) ReqInfo
	Sending(f *rawxds.Frame, cache *lkg.Cache)
	// HeldVersion is the version of typeURL that Envoy's latest request
	// said it holds: "" in Delta, whose requests carry none.
	HeldVersion(typeURL string) string
	// ProbeRequest is Envoy's first request, as a fresh subscription.
	ProbeRequest() R
	// Replay answers, from the cache, every type Envoy asked for so far;
	// Answer answers one more request.
	Replay(cache *lkg.Cache) []*rawxds.Frame
	Answer(req R, cache *lkg.Cache) []*rawxds.Frame
	// Resubscribe is what Envoy would send first on a new stream, holding
	// what it was sent on this one: the stream moves from the cache to
	// the control plane (resubscribe.go).
	Resubscribe() []R
}

// ReqInfo is what the proxy learns from one of Envoy's requests.
type ReqInfo struct {
	TypeURL string
	// Acked: it acknowledges a response forwarded on this stream, whose
	// version is Version.
	Acked   bool
	Version string
	// Nack is the error_detail's message when Envoy rejected a response.
	Nack string
}

// Type URLs, as Istio names them (pkg/model/xds.go).
const (
	envoyTypePrefix = "type.googleapis.com/envoy."
	// workloadType (ambient's WDS) is the one non-Envoy type Istio
	// forwards to its client.
	workloadType = "type.googleapis.com/istio.workload.Workload"
)

// Forwardable: Istio forwards Envoy's types and istio.workload.Workload,
// and drops anything else a control plane sends. The cache answers those
// types only.
func Forwardable(typeURL string) bool {
	return strings.HasPrefix(typeURL, envoyTypePrefix) || typeURL == workloadType
}

// ErrEmptyResource: a response of an agent type holding no resource, which
// is acknowledged and changes nothing (Istio's agent skips it).
var ErrEmptyResource = errors.New("no resource")

// IsCacheNonce: nonce is one of cacheNonce's.
func IsCacheNonce(nonce string) bool { return strings.HasPrefix(nonce, cacheNoncePrefix) }

// cacheNonce is a nonce of the proxy's own, for responses served from the
// cache: it cannot be mistaken for a control plane's.
func cacheNonce(stream uint64, n int) string {
	return cacheNoncePrefix + strconv.FormatUint(stream, 10) + "-" + strconv.Itoa(n)
}

const cacheNoncePrefix = "meshagent-cache-"

// nackOf is the message of a request's error_detail, which makes it a
// NACK: never empty then, so that "" means no NACK.
func nackOf[R Request](req R) string {
	d := req.GetErrorDetail()
	if d == nil {
		return ""
	}
	if d.GetMessage() == "" {
		return "rejected without a message"
	}
	return d.GetMessage()
}

// wildcardFirst is the stall rule's request in either protocol: it
// acknowledges nothing (no nonce) and is a wildcard subscription (no
// names, or "*" among them). Istio's control plane answers every such
// request on a new stream, whatever version Envoy holds; a request naming
// resources may go unanswered when they do not exist.
func wildcardFirst(nonce string, names []string) bool {
	return nonce == "" && (len(names) == 0 || slices.Contains(names, "*"))
}
