package xdsproxy

import (
	"log/slog"
	"sync"
	"sync/atomic"

	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/xdsproxy/protocol"
	"github.com/meshagent/meshagent/services/xdsproxy/pushdiff"
	"github.com/meshagent/meshagent/services/xdsproxy/stallwatch"
)

// One Envoy stream and its control plane stream. Five goroutines:
//
//	reader     Envoy → requests (never blocks, istio/istio#39209)
//	sender     requests → control plane
//	receiver   control plane → responses (bounded: responseQueue)
//	responder  responses → Envoy, or to the agent for its own types
//	watchdog   ends a stalled stream (stall.go)
//
// and the handler's own, which waits for the first of them to fail, then
// either returns (Envoy reconnects, as with Istio) or, when the control
// plane could not be reached at all, serves the cache (offline.go).
//
// What they learn (subscriptions, ACKs, NACKs, the stall watch, the status)
// they tell the proxy's state owner (owner.go), which keeps it.

// responseQueue is how many responses wait between the control plane and
// Envoy. With the one the receiver holds and the one being sent, at most
// responseQueue+2 responses are in the proxy: a slow Envoy slows the
// control plane down (gRPC flow control) instead of growing a buffer.
const responseQueue = 1

// requestQueue bounds the requests waiting for the control plane (Envoy's,
// and the agent's own). The queue must never block its writer: Envoy's
// requests are read only by the goroutine that queues them, and if that
// goroutine waited for the control plane while the control plane waited
// for Envoy to read its pushes, both sides would be blocked in Send for
// ever (istio/istio#39209; Istio's queue is unbounded). Nor may it drop
// one, as messages.Stream's Send does: a lost subscription or ACK leaves
// Envoy and the control plane out of step with nothing to bring them back.
// So past the bound the stream ends (errRequestQueueFull), and Envoy
// reconnects and restates what it wants on a new one (#26). Envoy sends
// about one request per response it takes, and at most responseQueue+2
// responses are in the proxy, so a working stream holds a handful; the
// bound is there for a client that writes without reading while the
// control plane does not read, which the stall watch would catch only
// after StallTimeout.
const requestQueue = messages.DefaultStreamBound

var errRequestQueueFull = status.Errorf(codes.ResourceExhausted,
	"more than %d requests wait for the control plane: ending the stream, reconnect to restate them", requestQueue)

// outgoing is a request on its way to the control plane.
type outgoing[R protocol.Request] struct {
	req   R
	agent bool // the agent's own (NDS, ProxyConfig, health, ACKs of those)
	// seq numbers Envoy's requests (the reader's count) and the agent's
	// subscriptions and health reports (the owner's): a stream moving from
	// the cache to the control plane resubscribes with what was queued up
	// to a point, and drops the requests it covered (reattach.go). 0: not
	// numbered (the agent's ACKs), never covered.
	seq uint64
}

type stream[R protocol.Request] struct {
	svc  *Service
	own  *owner
	pr   protocol.Protocol[R]
	id   uint64
	log  *slog.Logger
	down grpc.ServerStream

	// owned is the stream's part of the proxy's state: the owner's alone.
	owned streamState[R]

	// requests wait here for the control plane (requestQueue).
	requests *messages.Stream[outgoing[R]]
	// diff is what the stream last sent Envoy, for the debug log of each
	// push (pushdiff.go); nil until debug logging asks for it.
	diff *pushdiff.Diff
	// firstReq is closed once node is set (Envoy's first request).
	firstReq chan struct{}
	node     string
	// readDone is closed when the reader stops; readErr says why.
	readDone chan struct{}
	readErr  error
	// ended is closed by end: a newer stream replaced this one, or the
	// service stops; endErr is what the handler returns then.
	ended   chan struct{}
	endErr  error
	endOnce sync.Once
	// redialed holds a request to end the upstream and dial afresh
	// (roots.go); one pending request is enough.
	redialed chan struct{}

	// inflight counts responses received and not yet sent or consumed.
	inflight atomic.Int64
	// agentVersions: per agent type, the version last accepted
	// (responder only).
	agentVersions map[string]string
}

var errShuttingDown = status.Error(codes.Unavailable, "the agent's XDS proxy is shutting down")

// serveStream is the body of both ADS handlers (adsServiceDesc): a new
// stream of Serve's run sv, numbered, in protocol pr.
func serveStream[R protocol.Request](sv *server, pr protocol.Protocol[R], down grpc.ServerStream) error {
	s := sv.svc
	id := s.streamIDs.Add(1)
	st := &stream[R]{
		svc: s, own: sv.own, pr: pr, id: id, down: down,
		log:           s.log.With("stream", id, "protocol", pr.Mode().String()),
		owned:         streamState[R]{tr: pr.NewTracker(id), stall: stallwatch.NewWatch(s.cfg.StallTimeout, s.clock.Now())},
		requests:      messages.NewStream[outgoing[R]](requestQueue, nil),
		firstReq:      make(chan struct{}),
		readDone:      make(chan struct{}),
		ended:         make(chan struct{}),
		redialed:      make(chan struct{}, 1),
		agentVersions: map[string]string{},
	}
	if err := sv.own.register(st, peerOf(down.Context())); err != nil {
		return err
	}
	defer sv.own.unregister(st)
	st.log.Debug("Envoy stream opened")
	// The reader outlives the handler by a moment (gRPC ends RecvMsg
	// when the handler returns); Serve waits for it.
	s.wg.Add(1)
	go st.read()
	err := st.run()
	st.log.Debug("Envoy stream closed", "error", err)
	return err
}

// end stops the stream with err (nil: replaced by a newer stream, which
// Istio ends with an OK status).
func (st *stream[R]) end(err error) {
	st.endOnce.Do(func() {
		st.endErr = err
		close(st.ended)
	})
}

// redial asks for the upstream to be ended and dialled afresh: a live
// stream ends as on an orderly end of the control plane's (Envoy
// reconnects), one serving the cache probes at once. A request made while
// the upstream is being dialled applies to that connection as soon as it
// is up: it may have been made with the old roots.
func (st *stream[R]) redial() {
	select {
	case st.redialed <- struct{}{}:
	default:
	}
}

// enqueue queues a request for the control plane; past requestQueue it
// ends the stream instead (requestQueue says why). It never blocks.
func (st *stream[R]) enqueue(o outgoing[R]) {
	if !st.requests.TrySend(o) {
		select {
		case <-st.ended:
		default:
			st.log.Warn("ending the stream: too many requests wait for the control plane", "max", requestQueue)
		}
		st.end(errRequestQueueFull)
	}
}

// healthRequest is Istio's health report: a HealthInformation request,
// with an Internal error detail and the probe's message when unhealthy.
func (st *stream[R]) healthRequest(h messages.WorkloadHealth) R {
	var detail *rpcstatus.Status
	if !h.Healthy {
		detail = internalError(h.Reason)
	}
	return st.pr.AgentRequest(healthInfoType, "", "", detail)
}

// read forwards Envoy's requests to the queue, never blocking on the
// control plane, and tells the owner what they say.
func (st *stream[R]) read() {
	s := st.svc
	defer s.wg.Done()
	defer close(st.readDone)
	record := false
	first := true
	var seq uint64
	for {
		req := st.pr.NewRequest()
		if err := st.down.RecvMsg(req); err != nil {
			if status.Code(err) == codes.ResourceExhausted {
				st.log.Warn("refused a request on the XDS socket: larger than the bound", "max_bytes", maxRequestSize, "error", err)
			}
			st.readErr = err
			return
		}
		if first {
			st.node = req.GetNode().GetId()
			record = s.records(st.node)
		}
		seq++
		st.observed(req, record, seq)
		if first {
			// After the owner has it: whoever waits for the first
			// request (canServeCache) then finds it tracked.
			first = false
			close(st.firstReq)
		}
		st.enqueue(outgoing[R]{req: req, seq: seq})
		if req.GetTypeUrl() == listenerType {
			st.sendInitial()
		}
	}
}

// Where a live stream's end came from.
const (
	fromUpstream = iota
	fromDownstream
	fromStall
	fromEnd
	fromRedial
)

type liveEnd struct {
	from     int
	err      error
	answered bool // the control plane sent at least one response
}

// run connects upstream and proxies until one side ends.
func (st *stream[R]) run() error {
	up, err := st.dial()
	if err != nil {
		return st.upstreamFailed(err)
	}
	return st.finish(st.live(up, nil), false)
}

// dial opens the stream's upstream, counting a failure.
func (st *stream[R]) dial() (*upstream, error) {
	up, err := st.svc.openUpstream(st.down.Context(), st.pr.Method())
	if err != nil {
		st.svc.m.istiodFailures.Inc()
	}
	return up, err
}

// finish is what the handler returns once a live stream ended. reattached:
// the stream moved from the cache to the control plane (reattach.go); a
// control plane that fails again before answering then ends Envoy's
// stream instead of serving the cache a second time.
func (st *stream[R]) finish(end liveEnd, reattached bool) error {
	s := st.svc
	switch end.from {
	case fromEnd:
		return st.endErr
	case fromRedial:
		// As when the control plane ends a stream in order: Envoy's
		// stream ends OK, Envoy reconnects at once with what it holds, and
		// the new stream dials with the new roots (#26).
		st.log.Debug("upstream ended to redial; Envoy reconnects")
		return envoyError(nil)
	case fromDownstream:
		s.m.envoyTerminations.WithLabelValues(terminationLabel(end.err)).Inc()
		return envoyError(end.err)
	case fromStall:
		s.m.stalls.Inc()
		st.log.Warn("ending a stalled stream", "error", end.err)
		if !end.answered {
			// A control plane that never answered is as good as
			// unreachable: the cache may serve.
			return st.notAnswered(end.err, reattached)
		}
		st.own.failed(end.err, false)
		return end.err
	}
	s.m.istiodTerminations.WithLabelValues(terminationLabel(end.err)).Inc()
	if !end.answered {
		return st.notAnswered(end.err, reattached)
	}
	if expected(end.err) {
		// A control plane going away in order (istiod rotates its
		// connections): Envoy reconnects at once, no failure to report.
		st.log.Info("control plane ended the stream; Envoy reconnects", "error", end.err)
		return envoyError(end.err)
	}
	st.log.Warn("control plane stream failed; ending Envoy's stream so that it reconnects", "error", s.cfg.describe(end.err))
	st.own.failed(end.err, false)
	return envoyError(end.err)
}

// notAnswered handles a control plane that failed before answering: as
// unreachable on a new stream, as a failed switch on a reattached one.
func (st *stream[R]) notAnswered(err error, reattached bool) error {
	if reattached {
		return st.reattachFailed(err)
	}
	return st.upstreamFailed(err)
}

// upstreamFailed handles a control plane that could not be reached or
// refused the stream before answering anything: serve the cache if there
// is one for this Envoy, else end Envoy's stream with the error (Envoy
// retries with its own backoff, as with Istio).
func (st *stream[R]) upstreamFailed(err error) error {
	s := st.svc
	if st.canServeCache() {
		return st.serveCache(err)
	}
	st.log.Warn("cannot reach the control plane; ending Envoy's stream so that it retries", "address", s.cfg.DiscoveryAddress, "error", s.cfg.describe(err))
	st.own.failed(err, false)
	return envoyError(err)
}
