package testkit

import (
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
)

// Timeout bounds every wait of the kit: long enough for a loaded machine
// running -race, short enough that a hang fails its test rather than the
// whole run. It detects deadlocks; it never measures performance.
const Timeout = 30 * time.Second

// pollInterval is how often WaitFor asks again.
const pollInterval = 5 * time.Millisecond

// WaitFor polls cond until it holds, and fails the test naming what it
// waited for when it has not within Timeout. For conditions nothing
// signals (a file, an HTTP answer, a process); a value sent on a channel
// of the agent is better waited for with Recorder or WaitValue, which wake
// on each send.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", Timeout, what)
		}
		time.Sleep(pollInterval)
	}
}

// WaitValue waits until the latest value of l satisfies ok, and returns
// it. It wakes on every send, so it neither polls nor misses a value that
// stays.
func WaitValue[T any](t testing.TB, l messages.Latest[T], what string, ok func(T) bool) T {
	t.Helper()
	deadline := time.NewTimer(Timeout)
	defer deadline.Stop()
	for {
		v, set, changed := l.Watch()
		if set && ok(v) {
			return v
		}
		select {
		case <-changed:
		case <-deadline.C:
			if !set {
				t.Fatalf("timed out after %v waiting for %s; nothing was sent", Timeout, what)
			}
			t.Fatalf("timed out after %v waiting for %s; latest %+v", Timeout, what, v)
		}
	}
}

// Until is the kit's one wait for a value that announces its changes:
// watch gives the value now and a channel closed at its next change; Until
// reads it again at each change until cond holds for the value (true) or
// stop is closed (false), and returns the value it read last. It wakes on
// every change, so it neither polls nor misses one.
func Until[V any](watch func() (V, <-chan struct{}), cond func(V) bool, stop <-chan struct{}) (V, bool) {
	for {
		v, changed := watch()
		if cond(v) {
			return v, true
		}
		select {
		case <-changed:
		case <-stop:
			return v, false
		}
	}
}

// Closed says, without waiting, whether ch is closed: a process or a run
// that signals its end by closing a channel has ended.
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
