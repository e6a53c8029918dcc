package xdsproxy

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"github.com/meshagent/meshagent/services/xdsproxy/protocol"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
)

// A connected stream: the sender, the receiver and the responder between
// Envoy and the control plane (stream.go has the stream's set-up, its
// reader and how it ends).

// live runs the four goroutines of a connected stream and returns how it
// ended, once the upstream goroutines have returned. resumed, when the
// stream moves from the cache to the control plane, is sent first and
// says which queued requests it covers (reattach.go). The responder may
// still be inside a Send to an Envoy that does not read: it returns when
// the handler does (gRPC cancels the stream), and Serve waits for it.
func (st *stream[R]) live(up *upstream, resumed *resumption[R]) liveEnd {
	s := st.svc
	done := make(chan struct{})
	upErr := make(chan error, 2)
	downErr := make(chan error, 1)
	stallErr := make(chan error, 1)
	// Responses wait in a channel, not a queue: the receiver must block
	// when it is full, so that gRPC's flow control slows the control plane
	// down to Envoy's pace.
	resps := make(chan *rawxds.Frame, responseQueue)
	var answered atomic.Bool

	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); st.sendUpstream(up, resumed, done, upErr) }()
	go func() { defer wg.Done(); st.receiveUpstream(up, &answered, resps, done, upErr) }()
	go func() {
		defer wg.Done()
		if err := st.watchStall(done); err != nil {
			stallErr <- err
		}
	}()
	s.wg.Add(1)
	go func() { defer s.wg.Done(); st.respond(resps, done, downErr) }()

	var end liveEnd
	select {
	case err := <-upErr:
		end = liveEnd{from: fromUpstream, err: err}
	case err := <-downErr:
		end = liveEnd{from: fromDownstream, err: err}
	case <-st.readDone:
		end = liveEnd{from: fromDownstream, err: st.readErr}
	case err := <-stallErr:
		end = liveEnd{from: fromStall, err: err}
	case <-st.ended:
		end = liveEnd{from: fromEnd}
	case <-st.redialed:
		end = liveEnd{from: fromRedial}
	}
	end.answered = answered.Load()
	close(done)
	up.close()
	wg.Wait()
	return end
}

func (st *stream[R]) sendUpstream(up *upstream, resumed *resumption[R], done <-chan struct{}, upErr chan<- error) {
	if resumed != nil {
		for _, o := range resumed.reqs {
			if !st.sendRequest(up, o, upErr) {
				return
			}
		}
	}
	for {
		select {
		case <-st.requests.Ready():
		case <-done:
			return
		}
		for _, o := range st.requests.Take() {
			if resumed != nil {
				var ok bool
				if o, ok = resumed.pass(st.pr, o); !ok {
					continue
				}
			}
			if !st.sendRequest(up, o, upErr) {
				return
			}
		}
	}
}

// sendRequest sends o upstream; false when the stream is over (the error,
// if not io.EOF, on upErr).
func (st *stream[R]) sendRequest(up *upstream, o outgoing[R], upErr chan<- error) bool {
	s := st.svc
	t := o.req.GetTypeUrl()
	asked := ""
	if !o.agent && st.pr.AwaitsAnswer(o.req) {
		asked = t
	}
	s.m.requests.Inc()
	s.m.messages.WithLabelValues(typeLabel(t), dirRequest).Inc()
	st.sendStart(asked)
	err := up.stream.SendMsg(o.req)
	st.sendDone()
	if err != nil {
		// io.EOF: the stream is over, and the receiver reads why.
		if !errors.Is(err, io.EOF) {
			upErr <- err
		}
		return false
	}
	return true
}

func (st *stream[R]) receiveUpstream(up *upstream, answered *atomic.Bool,
	resps chan<- *rawxds.Frame, done <-chan struct{}, upErr chan<- error,
) {
	s := st.svc
	for {
		f := new(rawxds.Frame)
		if err := up.stream.RecvMsg(f); err != nil {
			upErr <- err
			return
		}
		st.answered(f.TypeURL)
		if !answered.Swap(true) {
			st.log.Info("connected to the control plane", "address", s.cfg.DiscoveryAddress)
			st.own.connected()
		}
		s.m.responses.Inc()
		label := typeLabel(f.TypeURL)
		s.m.messages.WithLabelValues(label, dirResponse).Inc()
		s.m.bytes.WithLabelValues(label, dirResponse).Add(float64(f.Body.Len()))
		s.noteInflight(st.inflight.Add(1))
		select {
		case resps <- f:
		case <-done:
			return
		}
	}
}

// respond hands each response to the agent (its own types) or to Envoy,
// in the order the control plane sent them; but ECDS, when its Wasm
// modules are fetched first (ecds.go), follows once they are.
func (st *stream[R]) respond(resps <-chan *rawxds.Frame, done <-chan struct{}, downErr chan<- error) {
	ecds := st.startECDS(done)
	defer ecds.close()
	for {
		var err error
		select {
		case f := <-resps:
			if ecds != nil && f.TypeURL == extensionConfigType {
				err = st.submitECDS(ecds, f, done)
			} else {
				err = st.handleResponse(f)
			}
			st.inflight.Add(-1)
		case r := <-ecds.results():
			err = st.finishECDS(r)
		case <-done:
			return
		}
		if err != nil {
			downErr <- err
			return
		}
	}
}

func (st *stream[R]) handleResponse(f *rawxds.Frame) error {
	s := st.svc
	if s.agentType(f.TypeURL) {
		st.consumeAgent(f)
		return nil
	}
	if !protocol.Forwardable(f.TypeURL) {
		st.log.Error("not forwarding a response of a type Envoy does not know", "type_url", f.TypeURL)
		return nil
	}
	st.sending(f)
	st.logPushDiff(f)
	return st.down.SendMsg(f)
}

// records reports whether the cache takes this stream's configuration
// (its node is the configured one): false until Envoy's first request.
func (st *stream[R]) records() bool {
	select {
	case <-st.firstReq:
		return st.svc.records(st.node)
	default:
		return false
	}
}

// consumeAgent applies a response of an agent type and ACKs or NACKs it
// upstream; it never reaches Envoy.
func (st *stream[R]) consumeAgent(f *rawxds.Frame) {
	res, version, err := st.pr.AgentResource(f)
	switch {
	case errors.Is(err, protocol.ErrEmptyResource):
		err = nil
	case err == nil:
		err = st.svc.consume(f.TypeURL, res, version)
		if err == nil && f.TypeURL == nameTableType && st.records() {
			st.own.putNames(res.GetValue(), version)
		}
	}
	// The reply ACKs (no error detail) or NACKs the response, with the
	// version the agent last accepted.
	var reply R
	if err != nil {
		st.log.Warn("rejecting (NACK) a response for the agent", "type_url", f.TypeURL, "version", version, "nonce", f.Nonce, "error", err)
		reply = st.pr.AgentRequest(f.TypeURL, st.agentVersions[f.TypeURL], f.Nonce, internalError(err.Error()))
	} else {
		st.agentVersions[f.TypeURL] = f.Version
		st.own.ack(f.TypeURL, f.Version)
		reply = st.pr.AgentRequest(f.TypeURL, f.Version, f.Nonce, nil)
	}
	st.enqueue(outgoing[R]{req: reply, agent: true})
}
