package messages

import "sync"

// Reporter is how a service says how it is: it stamps each report with the
// service's name and the clock's time, and sends it on the Health stream,
// skipping an exact repeat of the report before it so that a noisy input (a
// directory that changes ten times a second) does not flood the status
// server.
//
// The tree makes one Reporter per service and hands the same one to the
// service (in its Runtime) and to the runner that restarts it. That is what
// makes the repeat check right across restarts: the runner's "failed" sits
// between a run's "ready" and the next run's "ready", so the second "ready"
// is not a repeat. It is also what keeps names from drifting: the tree checks
// that the service's String() is the name its Reporter reports under.
type Reporter struct {
	name  string
	sink  Sink[Health]
	clock Clock

	mu   sync.Mutex
	last Health
	sent bool
}

// NewReporter returns a Reporter for the service called name. A nil clock is
// the system clock.
func NewReporter(name string, sink Sink[Health], clock Clock) *Reporter {
	if clock == nil {
		clock = SystemClock{}
	}
	return &Reporter{name: name, sink: sink, clock: clock}
}

// Name is the service name the reports carry.
func (r *Reporter) Name() string { return r.name }

// Report sends the service's state and, when not Ready, why. It is safe to
// call from any goroutine.
func (r *Reporter) Report(state HealthState, reason string) {
	r.mu.Lock()
	if r.sent && r.last.State == state && r.last.Reason == reason {
		r.mu.Unlock()
		return
	}
	h := Health{Service: r.name, State: state, Reason: reason, Time: r.clock.Now()}
	r.last, r.sent = h, true
	// Sending under the lock keeps the stream's order the order of the
	// reports; Sink.Send never blocks.
	r.sink.Send(h)
	r.mu.Unlock()
}

// Last is the last report sent (ok false before the first).
func (r *Reporter) Last() (Health, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last, r.sent
}
