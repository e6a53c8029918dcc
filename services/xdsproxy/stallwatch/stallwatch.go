// Package stallwatch is the XDS proxy's rule for a stalled control plane.
//
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
//
// It owns the rule (Watch) and the error that ends a stalled stream
// (Error), not the clock or the stream: the proxy's state owner feeds a
// Watch with each event and the time it happened at, and asks it. It was
// part of package xdsproxy until #34 split the proxy into packages a
// reader can hold.
package stallwatch

import (
	"fmt"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Watch is one stream's stall tracking. It has no lock: the proxy's
// state owner keeps it (xdsproxy's owner.go), and each event carries the time it
// happened at.
type Watch struct {
	timeout  time.Duration
	last     time.Time // the control plane's last sign of life
	awaiting map[string]bool
	sending  bool
}

// NewWatch is a Watch that ends a stream after timeout of silence, from
// now.
func NewWatch(timeout time.Duration, now time.Time) *Watch {
	return &Watch{timeout: timeout, last: now, awaiting: map[string]bool{}}
}

// Asked: Envoy's request for typeURL, which needs an answer, is about to
// be sent.
func (w *Watch) Asked(now time.Time, typeURL string) {
	w.startWaiting(now)
	w.awaiting[typeURL] = true
}

// startWaiting: a quiet time with nothing waiting is no silence of the
// control plane; the clock starts when something begins to wait.
func (w *Watch) startWaiting(now time.Time) {
	if len(w.awaiting) == 0 && !w.sending {
		w.last = now
	}
}

// SendStart, SendDone bracket a Send to the control plane; a finished
// Send is a sign of life (it was read, or fit its flow-control window).
func (w *Watch) SendStart(now time.Time) {
	w.startWaiting(now)
	w.sending = true
}

func (w *Watch) SendDone(now time.Time) {
	w.sending = false
	w.last = now
}

// Answered: a response of typeURL arrived.
func (w *Watch) Answered(now time.Time, typeURL string) {
	delete(w.awaiting, typeURL)
	w.last = now
}

// Stalled returns the stall error when requests have waited too long.
// delivering says whether responses wait for Envoy: then the control plane
// has answered, and a blocked Send is Envoy's slowness reaching it through
// flow control, not a stall.
func (w *Watch) Stalled(now time.Time, delivering bool) error {
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
	return &Error{idle: idle, types: types, sending: w.sending}
}

// Error ends a stalled stream. Envoy sees Unavailable and reconnects.
type Error struct {
	idle    time.Duration
	types   []string
	sending bool
}

func (e *Error) Error() string {
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
func (e *Error) GRPCStatus() *status.Status { return status.New(codes.Unavailable, e.Error()) }
