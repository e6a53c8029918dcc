package messages

import "sync"

// DefaultStreamBound is the number of unread events a stream holds before it
// starts dropping the oldest.
const DefaultStreamBound = 1024

// Stream is a buffered event stream with one consumer. Send never blocks.
// Events are delivered in order; if the consumer falls more than the bound
// behind, the oldest unread event is dropped, counted in Dropped, and
// reported to the overflow callback, so nothing is lost silently.
type Stream[T any] struct {
	mu         sync.Mutex
	queue      []T
	bound      int
	dropped    uint64
	ready      chan struct{} // holds one token while queue is non-empty
	onOverflow func(dropped uint64)
}

// NewStream returns a stream that holds up to bound unread events
// (DefaultStreamBound if bound <= 0). onOverflow, if not nil, is called
// (without locks held) each time an event is dropped, with the running total.
func NewStream[T any](bound int, onOverflow func(dropped uint64)) *Stream[T] {
	if bound <= 0 {
		bound = DefaultStreamBound
	}
	return &Stream[T]{bound: bound, ready: make(chan struct{}, 1), onOverflow: onOverflow}
}

// Send queues v. It never blocks.
func (s *Stream[T]) Send(v T) {
	s.mu.Lock()
	var dropped uint64
	if len(s.queue) >= s.bound {
		var zero T
		s.queue[0] = zero
		s.queue = s.queue[1:]
		s.dropped++
		dropped = s.dropped
	}
	s.queue = append(s.queue, v)
	select {
	case s.ready <- struct{}{}:
	default:
	}
	s.mu.Unlock()
	if dropped > 0 && s.onOverflow != nil {
		s.onOverflow(dropped)
	}
}

// TrySend queues v unless the stream already holds its bound of unread
// events; then it queues nothing, drops nothing and reports false. It is for
// a consumer that must not lose an event and ends instead, as the XDS proxy
// ends a stream whose requests pile up (a lost xDS request would leave Envoy
// and the control plane out of step for good; #26). It never blocks.
func (s *Stream[T]) TrySend(v T) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) >= s.bound {
		return false
	}
	s.queue = append(s.queue, v)
	select {
	case s.ready <- struct{}{}:
	default:
	}
	return true
}

// Ready is signalled when events are waiting. After a receive from Ready,
// call Take.
func (s *Stream[T]) Ready() <-chan struct{} { return s.ready }

// Take removes and returns every waiting event, oldest first (nil if none).
func (s *Stream[T]) Take() []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.queue
	s.queue = nil
	// Drain a token left by a Send that raced with this Take, so that
	// Ready does not fire for an empty queue.
	select {
	case <-s.ready:
	default:
	}
	return out
}

// Dropped is how many events were dropped because the consumer was too slow.
func (s *Stream[T]) Dropped() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Source is the read side of a Stream, for its one consumer.
type Source[T any] interface {
	Ready() <-chan struct{}
	Take() []T
}
