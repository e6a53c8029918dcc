package messages

import "time"

// Clock is the agent's one time source. Services and the tree take it from
// their Runtime; tests replace it (testdata/testkit has a manual one) to make
// backoff, renewal and polling instant and deterministic.
type Clock interface {
	Now() time.Time
	// After is time.After: a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

// SystemClock is the real clock.
type SystemClock struct{}

func (SystemClock) Now() time.Time                         { return time.Now() }
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
