package testkit

import (
	"strings"
	"testing"

	"github.com/meshagent/meshagent/messages"
)

// HealthRecorder is the Health stream of one service or of several: it
// keeps every report, and waits for a state.
type HealthRecorder struct {
	Recorder[messages.Health]
}

// WaitState waits until the latest report is state with a reason that
// holds reasonHas ("" for any reason), and returns it.
func (h *HealthRecorder) WaitState(t testing.TB, state messages.HealthState, reasonHas string) messages.Health {
	t.Helper()
	return h.WaitLast(t, describe("", state, reasonHas), is(state, reasonHas))
}

// WaitService is WaitState for the latest report of one service, when
// several report into h.
func (h *HealthRecorder) WaitService(t testing.TB, service string, state messages.HealthState, reasonHas string) messages.Health {
	t.Helper()
	var latest messages.Health
	h.WaitFor(t, describe(service, state, reasonHas), func(all []messages.Health) bool {
		for i := len(all) - 1; i >= 0; i-- {
			if all[i].Service == service {
				latest = all[i]
				return is(state, reasonHas)(latest)
			}
		}
		return false
	})
	return latest
}

// Saw says whether any report so far was service's ("" for any service)
// in state with a reason that holds reasonHas.
func (h *HealthRecorder) Saw(service string, state messages.HealthState, reasonHas string) bool {
	for _, v := range h.All() {
		if (service == "" || v.Service == service) && is(state, reasonHas)(v) {
			return true
		}
	}
	return false
}

func is(state messages.HealthState, reasonHas string) func(messages.Health) bool {
	return func(v messages.Health) bool { return v.State == state && strings.Contains(v.Reason, reasonHas) }
}

func describe(service string, state messages.HealthState, reasonHas string) string {
	s := "health " + state.String()
	if service != "" {
		s = service + " " + s
	}
	if reasonHas != "" {
		s += " with a reason holding " + `"` + reasonHas + `"`
	}
	return s
}
