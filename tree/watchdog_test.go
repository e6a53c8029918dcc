package tree

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// recordingNotifier is systemd as the tree sees it: a watchdog interval and
// the states it was told.
type recordingNotifier struct {
	interval time.Duration
	states   chan string
}

func (n *recordingNotifier) Notify(state string) error {
	n.states <- state
	return nil
}

func (n *recordingNotifier) WatchdogInterval() time.Duration { return n.interval }

// The watchdog pings at half systemd's interval on the agent's clock
// (issue 26): a manual clock moved by half an interval brings one ping
// each time, with no real time passing.
func TestWatchdogRunsOnTheAgentClock(t *testing.T) {
	clock := testkit.NewManualClock()
	notifier := &recordingNotifier{interval: time.Hour, states: make(chan string, 16)}
	ch := NewChannels(nil)
	svc := &readyService{name: "svc", health: ch.Health}
	a, err := New(ch, []Node{{Service: svc}}, prometheus.NewRegistry(), testkit.TestLogger(t),
		Options{Clock: clock, Notifier: notifier})
	if err != nil {
		t.Fatal(err)
	}
	// Without a status server nothing computes readiness: say ready.
	ch.Readiness.Send(messages.Readiness{Ready: true})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()

	next := func() string {
		t.Helper()
		select {
		case s := <-notifier.states:
			return s
		case <-time.After(testkit.Timeout):
			t.Fatal("no sd_notify state")
			return ""
		}
	}
	if s := next(); s != "READY=1" {
		t.Fatalf("first state %q; want READY=1", s)
	}
	for i := range 3 {
		testkit.WaitFor(t, "the watchdog to wait on the clock", func() bool { n, _ := clock.Pending(); return n > 0 })
		clock.Advance(30 * time.Minute)
		if s := next(); s != "WATCHDOG=1" {
			t.Fatalf("ping %d: state %q; want WATCHDOG=1", i, s)
		}
	}
}
