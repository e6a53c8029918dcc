package testkit

import (
	"sync"
	"testing"
	"time"
)

// ManualClock is a messages.Clock that moves only when the test moves it:
// backoff, renewal and timeouts become instant and deterministic.
type ManualClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []clockWaiter
	added   chan struct{} // closed and replaced when a waiter is added
}

type clockWaiter struct {
	at time.Time
	ch chan time.Time
}

// NewManualClock is a ManualClock at a fixed, arbitrary time.
func NewManualClock() *ManualClock {
	return &ManualClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), added: make(chan struct{})}
}

// Now is the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After fires once the clock has been advanced by d (at once for d <= 0).
func (c *ManualClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, clockWaiter{at: c.now.Add(d), ch: ch})
	close(c.added)
	c.added = make(chan struct{})
	return ch
}

// Advance moves the clock and fires the waiters that are due.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
}

// Pending is how many waiters wait, and a channel closed when the next
// one is added.
func (c *ManualClock) Pending() (int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters), c.added
}

// AdvanceUntil advances the clock by step each time something waits on
// it, until done is closed (it returns true) or after max steps (false).
// Advancing only while something waits keeps the steps in step with the
// code under test, however slowly it runs.
func (c *ManualClock) AdvanceUntil(t testing.TB, step time.Duration, max int, done <-chan struct{}) bool {
	t.Helper()
	deadline := time.NewTimer(Timeout)
	defer deadline.Stop()
	for i := 0; i < max; i++ {
		for {
			n, added := c.Pending()
			if n > 0 {
				break
			}
			select {
			case <-added:
			case <-done:
				return true
			case <-deadline.C:
				t.Fatal("nothing waits on the clock")
			}
		}
		select {
		case <-done:
			return true
		default:
		}
		c.Advance(step)
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// FrozenClock's Now is always At; After is the system's. For a test that
// checks times computed from Now (a certificate's lifetime to the second)
// while waits still pass.
type FrozenClock struct{ At time.Time }

func (c FrozenClock) Now() time.Time                         { return c.At }
func (c FrozenClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
