package xdsproxy

import (
	"fmt"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A control plane can keep a stream open and answer nothing: the
// connection is alive, so keepalive never fires, and Envoy waits for ever
// on a proxy that waits for ever (istio/istio#57064: an ingress gateway
// without updates for two days). The watchdog ends such a stream once
// requests have waited StallTimeout without the control plane answering
// anything or accepting anything we sent; Envoy then reconnects, and a new
// stream may reach a working control plane.
//
// "Requests wait" means: Envoy subscribed to a type by wildcard (a request
// without a nonce, which istiod always answers, if only with an empty
// list) and no response of that type came; or a Send to the control plane
// is blocked (it is not reading). Requests naming resources may go
// unanswered when the resources do not exist, ACKs and the agent's own
// requests expect no answer: none of those count. A control plane that
// does not answer a wildcard request from an Envoy that already holds its
// version (go-control-plane does not) would see such a stream renewed
// every StallTimeout while it is quiet: noisy, harmless.

// stallWatch is one stream's stall tracking. It has no lock: the proxy's
// state owner keeps it (owner.go), and each event carries the time it
// happened at.
type stallWatch struct {
	timeout  time.Duration
	last     time.Time // the control plane's last sign of life
	awaiting map[string]bool
	sending  bool
}

func newStallWatch(timeout time.Duration, now time.Time) *stallWatch {
	return &stallWatch{timeout: timeout, last: now, awaiting: map[string]bool{}}
}

// asked: Envoy's request for typeURL, which needs an answer, is about to
// be sent.
func (w *stallWatch) asked(now time.Time, typeURL string) {
	w.startWaiting(now)
	w.awaiting[typeURL] = true
}

// startWaiting: a quiet time with nothing waiting is no silence of the
// control plane; the clock starts when something begins to wait.
func (w *stallWatch) startWaiting(now time.Time) {
	if len(w.awaiting) == 0 && !w.sending {
		w.last = now
	}
}

// sendStart, sendDone bracket a Send to the control plane; a finished
// Send is a sign of life (it was read, or fit its flow-control window).
func (w *stallWatch) sendStart(now time.Time) {
	w.startWaiting(now)
	w.sending = true
}

func (w *stallWatch) sendDone(now time.Time) {
	w.sending = false
	w.last = now
}

// answered: a response of typeURL arrived.
func (w *stallWatch) answered(now time.Time, typeURL string) {
	delete(w.awaiting, typeURL)
	w.last = now
}

// stalled returns the stall error when requests have waited too long.
// delivering says whether responses wait for Envoy: then the control plane
// has answered, and a blocked Send is Envoy's slowness reaching it through
// flow control, not a stall.
func (w *stallWatch) stalled(now time.Time, delivering bool) error {
	if len(w.awaiting) == 0 && !w.sending {
		return nil
	}
	if delivering {
		w.last = now
		return nil
	}
	idle := now.Sub(w.last)
	if idle < w.timeout {
		return nil
	}
	types := make([]string, 0, len(w.awaiting))
	for t := range w.awaiting {
		types = append(types, t)
	}
	sort.Strings(types)
	return &stallError{idle: idle, types: types, sending: w.sending}
}

// watchStall asks the owner every quarter of the timeout whether the
// stream stalled, until done is closed; it returns the stall error, or nil
// when done.
func (st *stream[R]) watchStall(done <-chan struct{}) error {
	every := st.svc.cfg.StallTimeout / 4
	for {
		select {
		case <-done:
			return nil
		case <-st.svc.clock.After(every):
		}
		if err := st.stalled(st.inflight.Load() > 0); err != nil {
			return err
		}
	}
}

// stallError ends a stalled stream. Envoy sees Unavailable and reconnects.
type stallError struct {
	idle    time.Duration
	types   []string
	sending bool
}

func (e *stallError) Error() string {
	what := fmt.Sprintf("requests for %v wait", e.types)
	if e.sending {
		what = "a request cannot be sent (the control plane is not reading)"
		if len(e.types) > 0 {
			what += fmt.Sprintf(" and requests for %v wait", e.types)
		}
	}
	return fmt.Sprintf("control plane stalled: nothing from it for %v while %s (istio/istio#57064)", e.idle.Round(time.Millisecond), what)
}

// GRPCStatus makes the error Unavailable for Envoy.
func (e *stallError) GRPCStatus() *status.Status { return status.New(codes.Unavailable, e.Error()) }
