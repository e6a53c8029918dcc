package messages

import "sync"

// Sink is the write side of any channel: a service that produces T gets a
// Sink[T] and nothing else.
type Sink[T any] interface {
	Send(v T)
}

// Discard is the Sink of an output nobody reads: it drops every value.
type Discard[T any] struct{}

// Send drops v.
func (Discard[T]) Send(T) {}

// Latest is the read side of a latest-value channel.
type Latest[T any] interface {
	// Get returns the current value and whether one was ever sent.
	Get() (T, bool)
	// Watch returns the current value, whether one was ever sent, and a
	// channel that is closed by the next Send. Reading the value and the
	// channel together is what makes a watch loop race-free:
	//
	//	for {
	//		v, ok, changed := l.Watch()
	//		use(v, ok)
	//		select { case <-changed: case <-ctx.Done(): return }
	//	}
	Watch() (T, bool, <-chan struct{})
}

// Cell is a latest-value channel: it implements both Sink (for its one
// writer) and Latest (for any number of readers). The zero value is not
// usable; call NewCell.
type Cell[T any] struct {
	mu      sync.Mutex
	value   T
	set     bool
	changed chan struct{}
	// watched: someone holds changed, so the next Send must close it.
	// Without watchers a Send allocates nothing.
	watched bool
}

// NewCell returns an empty cell.
func NewCell[T any]() *Cell[T] {
	return &Cell[T]{changed: make(chan struct{})}
}

// Send replaces the value and wakes every watcher. It never blocks.
func (c *Cell[T]) Send(v T) {
	c.mu.Lock()
	c.value, c.set = v, true
	if c.watched {
		close(c.changed)
		c.changed = make(chan struct{})
		c.watched = false
	}
	c.mu.Unlock()
}

// Get implements Latest.
func (c *Cell[T]) Get() (T, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.value, c.set
}

// Watch implements Latest.
func (c *Cell[T]) Watch() (T, bool, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watched = true
	return c.value, c.set, c.changed
}
