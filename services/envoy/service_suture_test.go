package envoy

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/thejerf/suture/v4"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// Under a real suture supervisor: a dead Envoy is restarted (next epoch),
// a drained one is not, and the supervisor's stop leaves no Envoy behind.
func TestUnderSupervisor(t *testing.T) {
	h := newHarness(t, nil, nil)
	sup := suture.New("test", suture.Spec{FailureBackoff: 10 * time.Millisecond, Timeout: 30 * time.Second})
	sup.Add(h.svc)
	ctx, cancel := context.WithCancel(context.Background())
	done := sup.ServeBackground(ctx)
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("supervisor: %v", err)
		}
	}()

	first := h.killWhen("ready", ready)
	second := h.waitState("restarted", func(s messages.EnvoyState) bool { return s.Phase.Alive() && s.PID != first.PID })
	if second.Epoch != first.Epoch+1 {
		t.Fatalf("epoch after restart = %d; want %d", second.Epoch, first.Epoch+1)
	}

	h.drain.Send(messages.Drain{Reason: "SIGTERM", Exit: true})
	h.waitState("stopped", func(s messages.EnvoyState) bool { return s.Phase == messages.EnvoyStopped })
	testkit.WaitFor(t, "the supervisor to drop the drained service", func() bool { return len(sup.Services()) == 0 })
	if st, _ := h.state.Get(); st.Phase != messages.EnvoyStopped || st.PID != second.PID || !pidGone(second.PID) {
		t.Fatalf("after the drain: %+v; want the second Envoy gone and no third", st)
	}
}
