package testkit

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Service is what the kit runs: every service of the tree, and the test
// servers built like them.
type Service interface {
	Serve(ctx context.Context) error
}

// Serving is a Service's Serve running in the background.
type Serving struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Serve's result, once done is closed

	mu       sync.Mutex
	stopping bool // Stop has begun: a return is expected
	waited   bool // Wait took Serve's result: the test judges it
}

// Serve runs svc.Serve on a goroutine until Stop, which the end of the
// test calls if the test has not. A Serve that returns by itself is
// logged, and fails the test at Stop unless the test took its result with
// Wait.
func Serve(t testing.TB, svc Service) *Serving {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Serving{name: fmt.Sprint(svc), cancel: cancel, done: make(chan struct{})}
	go func() {
		s.err = svc.Serve(ctx)
		s.mu.Lock()
		early := !s.stopping
		s.mu.Unlock()
		if early {
			t.Logf("%s: Serve returned %v", s.name, s.err)
		}
		close(s.done)
	}()
	t.Cleanup(func() { s.Stop(t) })
	return s
}

// Done is closed when Serve has returned.
func (s *Serving) Done() <-chan struct{} { return s.done }

// Err is what Serve returned; call it after Done.
func (s *Serving) Err() error { return s.err }

// Wait waits, bounded, for Serve to return by itself, and returns its
// error.
func (s *Serving) Wait(t testing.TB) error {
	t.Helper()
	select {
	case <-s.done:
		s.mu.Lock()
		s.waited = true
		s.mu.Unlock()
		return s.err
	case <-time.After(Timeout):
		t.Fatalf("%s: Serve did not return within %v", s.name, Timeout)
		return nil
	}
}

// Stop cancels Serve's context and checks that Serve returns
// context.Canceled, as a service does when told to stop (DESIGN.md: a
// deliberate stop is ctx.Err()). A second Stop does nothing.
func (s *Serving) Stop(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return
	}
	s.stopping = true
	waited := s.waited
	s.mu.Unlock()
	if waited {
		return
	}
	s.cancel()
	select {
	case <-s.done:
		if s.err != context.Canceled {
			t.Errorf("%s: Serve returned %v, want context.Canceled", s.name, s.err)
		}
	case <-time.After(Timeout):
		t.Errorf("%s: Serve did not return within %v of cancel", s.name, Timeout)
	}
}
