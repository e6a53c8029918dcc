package testkit

import (
	"context"
	"sync"
	"testing"
)

// Recorder is a channel end for a service's output that keeps every value
// sent, in order: a test can then wait for a value, count sends, or look
// at the whole history. It is a messages.Sink and, for the latest value, a
// messages.Latest. The zero value is ready to use.
type Recorder[T any] struct {
	mu      sync.Mutex
	values  []T
	changed chan struct{} // closed and replaced by each Send
}

// Send records v and wakes every wait. It never blocks.
func (r *Recorder[T]) Send(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.values = append(r.values, v)
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
}

// watch is the values so far and a channel closed by the next Send.
func (r *Recorder[T]) watch() ([]T, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.changed == nil {
		r.changed = make(chan struct{})
	}
	return r.values[:len(r.values):len(r.values)], r.changed
}

// All is every value sent so far, oldest first.
func (r *Recorder[T]) All() []T {
	vals, _ := r.watch()
	return append([]T(nil), vals...)
}

// Len is how many values were sent.
func (r *Recorder[T]) Len() int {
	vals, _ := r.watch()
	return len(vals)
}

// Get is the latest value and whether any was sent (messages.Latest).
func (r *Recorder[T]) Get() (T, bool) {
	v, ok, _ := r.Watch()
	return v, ok
}

// Watch is Get and a channel closed by the next Send (messages.Latest).
func (r *Recorder[T]) Watch() (T, bool, <-chan struct{}) {
	vals, changed := r.watch()
	var last T
	if len(vals) == 0 {
		return last, false, changed
	}
	return vals[len(vals)-1], true, changed
}

// WaitFor waits until cond holds for the values sent so far, and returns
// them.
func (r *Recorder[T]) WaitFor(t testing.TB, what string, cond func([]T) bool) []T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	vals, ok := Until(r.watch, cond, ctx.Done())
	if !ok {
		t.Fatalf("timed out after %v waiting for %s; %d values sent, the last %+v", Timeout, what, len(vals), lastOf(vals))
	}
	return vals
}

// WaitLast waits until the latest value satisfies ok, and returns it.
func (r *Recorder[T]) WaitLast(t testing.TB, what string, ok func(T) bool) T {
	t.Helper()
	vals := r.WaitFor(t, what, func(v []T) bool { return len(v) > 0 && ok(v[len(v)-1]) })
	return vals[len(vals)-1]
}

// Reached waits until cond holds (true) or stop is closed (false). It
// does not fail the test, so that a goroutine other than the test's may
// call it.
func (r *Recorder[T]) Reached(cond func([]T) bool, stop <-chan struct{}) bool {
	_, ok := Until(r.watch, cond, stop)
	return ok
}

func lastOf[T any](v []T) any {
	if len(v) == 0 {
		return nil
	}
	return v[len(v)-1]
}
