package xdsproxy

import (
	"context"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/services/xdsproxy/lkg"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
)

// ECDS responses with remote Wasm code (#35). Istio's agent hands each ECDS
// response to a goroutine of its own, which fetches the modules
// (pkg/wasm), rewrites the resources to the local files, and gives the
// response back to the loop that forwards to Envoy; a resource it cannot
// read is NACKed upstream instead, with the version Envoy holds. Here one
// worker per live stream takes them in the order they came, so that an
// older ECDS response never overtakes a newer one, while every other type
// goes on to Envoy meanwhile: a slow registry holds up ECDS only.
//
// The worker only fetches and re-encodes: it touches no state. The
// responder, the one goroutine that sends to Envoy, forwards what it
// returns, and the stream's own state stays with the owner (owner.go).

// ecdsQueue is how many ECDS responses may wait for the worker; past it,
// the responder waits too (and forwards the worker's results meanwhile),
// so that a control plane pushing ECDS faster than modules arrive is slowed
// down instead of filling memory.
const ecdsQueue = 16

// ecdsResult is one ECDS response, rewritten (f) or to be NACKed (err;
// orig is what the control plane sent).
type ecdsResult struct {
	f, orig *rawxds.Frame
	err     error
}

// ecdsWorker is a live stream's ECDS pipeline.
type ecdsWorker struct {
	in   chan *rawxds.Frame
	out  chan ecdsResult
	stop context.CancelFunc // ends a fetch in progress
}

// startECDS starts the worker of a live stream, which ends with done; nil
// when the proxy does not rewrite ECDS (Config.Wasm.Dir empty). The
// responder stops it when it returns.
func (st *stream[R]) startECDS(done <-chan struct{}) *ecdsWorker {
	s := st.svc
	if s.wasm == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(st.down.Context())
	w := &ecdsWorker{in: make(chan *rawxds.Frame, ecdsQueue), out: make(chan ecdsResult), stop: cancel}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			select {
			case f := <-w.in:
				nf, err := st.rewriteECDS(ctx, f)
				select {
				case w.out <- ecdsResult{f: nf, orig: f, err: err}:
				case <-done:
					return
				}
			case <-done:
				return
			}
		}
	}()
	return w
}

// close ends the worker's fetch in progress, if any (a nil worker: none).
func (w *ecdsWorker) close() {
	if w != nil {
		w.stop()
	}
}

// results is the worker's output; nil (never ready) without a worker.
func (w *ecdsWorker) results() <-chan ecdsResult {
	if w == nil {
		return nil
	}
	return w.out
}

// submitECDS hands f to the worker, forwarding the worker's results while
// its queue is full.
func (st *stream[R]) submitECDS(w *ecdsWorker, f *rawxds.Frame, done <-chan struct{}) error {
	for {
		select {
		case w.in <- f:
			return nil
		case r := <-w.out:
			if err := st.finishECDS(r); err != nil {
				return err
			}
		case <-done:
			return nil
		}
	}
}

// finishECDS forwards a rewritten response to Envoy, or NACKs the one that
// could not be, upstream, with the version Envoy holds (Istio's
// ecdsLastAckVersion).
func (st *stream[R]) finishECDS(r ecdsResult) error {
	if r.err == nil {
		return st.handleResponse(r.f)
	}
	var held string
	st.own.ask(func(*proxyState) { held = st.owned.tr.HeldVersion(extensionConfigType) })
	st.log.Warn("rejecting (NACK) an ECDS response: its Wasm filters cannot be made local", "version", r.orig.Version,
		"nonce", r.orig.Nonce, "error", r.err)
	st.enqueue(outgoing[R]{req: st.pr.AgentRequest(extensionConfigType, held, r.orig.Nonce, internalError(r.err.Error())), agent: true})
	return nil
}

// rewriteECDS is f with the remote Wasm code of its resources made local
// (wasm.Cache.RewriteAll); a response without any is re-encoded all the
// same, which costs little for the few resources ECDS carries.
func (st *stream[R]) rewriteECDS(ctx context.Context, f *rawxds.Frame) (*rawxds.Frame, error) {
	var b []byte
	var err error
	if st.pr.Mode() == lkg.ModeDelta {
		b, err = rewriteDelta(ctx, st.svc, f)
	} else {
		b, err = rewriteSotW(ctx, st.svc, f)
	}
	if err != nil {
		return nil, err
	}
	nf := &rawxds.Frame{Body: rawxds.Body{b}}
	if err := nf.Scan(); err != nil {
		return nil, err
	}
	return nf, nil
}

func rewriteSotW(ctx context.Context, s *Service, f *rawxds.Frame) ([]byte, error) {
	var r discoveryv3.DiscoveryResponse
	if err := proto.Unmarshal(f.Body.Bytes(), &r); err != nil {
		return nil, err
	}
	if err := s.wasm.RewriteAll(ctx, r.Resources); err != nil {
		return nil, err
	}
	return proto.Marshal(&r)
}

func rewriteDelta(ctx context.Context, s *Service, f *rawxds.Frame) ([]byte, error) {
	var r discoveryv3.DeltaDiscoveryResponse
	if err := proto.Unmarshal(f.Body.Bytes(), &r); err != nil {
		return nil, err
	}
	res := make([]*anypb.Any, len(r.GetResources()))
	for i, x := range r.GetResources() {
		res[i] = x.GetResource()
	}
	if err := s.wasm.RewriteAll(ctx, res); err != nil {
		return nil, err
	}
	for i, x := range r.GetResources() {
		x.Resource = res[i]
	}
	return proto.Marshal(&r)
}
