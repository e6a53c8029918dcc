package testkit

import (
	"sync"
	"sync/atomic"
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

// AdvanceToNext waits (up to Timeout) until something waits on the clock,
// then moves the clock to the earliest waiter's time, firing it: "the next
// tick", for a test that wants one more round of a periodic loop.
func (c *ManualClock) AdvanceToNext(t testing.TB) {
	t.Helper()
	deadline := time.NewTimer(Timeout)
	defer deadline.Stop()
	c.awaitWaiter(t, deadline.C, nil)
	c.mu.Lock()
	next := c.waiters[0].at
	for _, w := range c.waiters[1:] {
		if w.at.Before(next) {
			next = w.at
		}
	}
	d := next.Sub(c.now)
	c.mu.Unlock()
	c.Advance(d)
}

// awaitWaiter blocks until something waits on the clock (false) or done
// is closed (true; a nil done never is), failing t when deadline fires
// first: the wait AdvanceToNext and AdvanceUntil share.
func (c *ManualClock) awaitWaiter(t testing.TB, deadline <-chan time.Time, done <-chan struct{}) bool {
	t.Helper()
	for {
		n, added := c.Pending()
		if n > 0 {
			return false
		}
		select {
		case <-added:
		case <-done:
			return true
		case <-deadline:
			t.Fatal("nothing waits on the clock")
		}
	}
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
		if c.awaitWaiter(t, deadline.C, done) {
			return true
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

// RecordingClock is the real clock moved forward by Skip, recording every
// wait asked of After: a test sees exactly which waits the code under test
// chose (a restart policy's backoff, a first check at once). With Wait
// false, After fires at once, so the test does not wait them out; with Wait
// true, After is the system's.
type RecordingClock struct {
	Wait   bool
	offset atomic.Int64
	mu     sync.Mutex
	waits  []time.Duration
}

// Now is the real time plus every Skip.
func (c *RecordingClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// After records d; it fires at once unless Wait.
func (c *RecordingClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.mu.Unlock()
	if c.Wait {
		return time.After(d)
	}
	ch := make(chan time.Time, 1)
	ch <- c.Now()
	return ch
}

// Skip moves Now forward by d.
func (c *RecordingClock) Skip(d time.Duration) { c.offset.Add(int64(d)) }

// Waits are the durations asked of After, in order.
func (c *RecordingClock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}
