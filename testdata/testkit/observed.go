package testkit

import (
	"context"
	"fmt"
	"sync"
)

// Observed is a value that changes while tests wait on it: the xDS test
// client's state, the test control plane's counters. Update changes it and
// wakes every wait; Get and WaitFor see copies made by clone, so that a
// test never reads maps the owner is still writing.
type Observed[V any] struct {
	clone   func(V) V
	mu      sync.Mutex
	v       V
	changed chan struct{} // closed and replaced by each Update
}

// NewObserved is an Observed holding v.
func NewObserved[V any](v V, clone func(V) V) *Observed[V] {
	return &Observed[V]{clone: clone, v: v, changed: make(chan struct{})}
}

// Update changes the value with f, under the lock, and wakes every wait.
func (o *Observed[V]) Update(f func(*V)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f(&o.v)
	close(o.changed)
	o.changed = make(chan struct{})
}

// Get is a copy of the value now.
func (o *Observed[V]) Get() V {
	v, _ := o.watch()
	return v
}

// WaitFor waits until cond holds for the value: nil, or, when ctx ends
// first, an error naming who waited, the value read last and ctx's error.
func (o *Observed[V]) WaitFor(ctx context.Context, who string, cond func(V) bool) error {
	if v, ok := Until(o.watch, cond, ctx.Done()); !ok {
		return fmt.Errorf("%s: waiting for a condition on %+v: %w", who, v, ctx.Err())
	}
	return nil
}

// watch is a copy of the value now and a channel closed at its next change.
func (o *Observed[V]) watch() (V, <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.clone(o.v), o.changed
}
