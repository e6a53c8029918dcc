package xdsproxy

import "sync"

// queue is the unbounded queue from Envoy to the control plane. It must
// never block its writer: Envoy's requests are read only by the goroutine
// that puts them here, and if that goroutine waited for the control plane
// while the control plane waited for Envoy to read its pushes, both sides
// would be blocked in Send for ever (istio/istio#39209). Requests are small
// and Envoy sends one per response at most, so the queue stays short in
// practice; it is the responses that need a bound, and they have one
// (responseQueue in stream.go).
type queue[T any] struct {
	mu    sync.Mutex
	items []T
	ready chan struct{} // holds a token while items is not empty
}

func newQueue[T any]() *queue[T] { return &queue[T]{ready: make(chan struct{}, 1)} }

func (q *queue[T]) put(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take removes and returns every waiting item, oldest first.
func (q *queue[T]) take() []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.items
	q.items = nil
	return out
}

// len is the number of waiting items.
func (q *queue[T]) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}
