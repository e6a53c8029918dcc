package xdsproxy

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
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

type stallWatch struct {
	clock   messages.Clock
	timeout time.Duration
	// delivering reports whether responses wait for Envoy: then the
	// control plane has answered, and a blocked Send is Envoy's slowness
	// reaching it through flow control, not a stall.
	delivering func() bool

	mu       sync.Mutex
	last     time.Time // the control plane's last sign of life
	awaiting map[string]bool
	sending  bool
}

func newStallWatch(clock messages.Clock, timeout time.Duration, delivering func() bool) *stallWatch {
	return &stallWatch{clock: clock, timeout: timeout, delivering: delivering, last: clock.Now(), awaiting: map[string]bool{}}
}

// asked: Envoy's request for typeURL, which needs an answer, is about to
// be sent.
func (w *stallWatch) asked(typeURL string) {
	w.mu.Lock()
	w.startWaiting()
	w.awaiting[typeURL] = true
	w.mu.Unlock()
}

// startWaiting: a quiet time with nothing waiting is no silence of the
// control plane; the clock starts when something begins to wait.
func (w *stallWatch) startWaiting() {
	if len(w.awaiting) == 0 && !w.sending {
		w.last = w.clock.Now()
	}
}

// sendStart, sendDone bracket a Send to the control plane; a finished
// Send is a sign of life (it was read, or fit its flow-control window).
func (w *stallWatch) sendStart() {
	w.mu.Lock()
	w.startWaiting()
	w.sending = true
	w.mu.Unlock()
}

func (w *stallWatch) sendDone() {
	w.mu.Lock()
	w.sending = false
	w.last = w.clock.Now()
	w.mu.Unlock()
}

// answered: a response of typeURL arrived.
func (w *stallWatch) answered(typeURL string) {
	w.mu.Lock()
	delete(w.awaiting, typeURL)
	w.last = w.clock.Now()
	w.mu.Unlock()
}

// stalled returns the stall error when requests have waited too long.
func (w *stallWatch) stalled() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.awaiting) == 0 && !w.sending {
		return nil
	}
	if w.delivering() {
		w.last = w.clock.Now()
		return nil
	}
	idle := w.clock.Now().Sub(w.last)
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

// watch checks every quarter of the timeout until done is closed, and
// returns the stall error, or nil when done.
func (w *stallWatch) watch(done <-chan struct{}) error {
	every := w.timeout / 4
	for {
		select {
		case <-done:
			return nil
		case <-w.clock.After(every):
		}
		if err := w.stalled(); err != nil {
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
