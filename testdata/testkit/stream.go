package testkit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// DialPlain is a plaintext gRPC client of target ("unix:///path" or
// host:port), closed at the end of the test: how a test reaches the SDS,
// XDS and control-plane servers it runs. opts add to the plaintext
// credentials.
func DialPlain(t testing.TB, target string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// OpenStream opens a gRPC stream (open is a client's streaming method) on
// a context of its own, which cancel ends; a stream that does not open
// fails the test.
func OpenStream[S any](t testing.TB, open func(context.Context, ...grpc.CallOption) (S, error)) (S, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := open(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	return stream, cancel
}

// Receiver reads the responses of a gRPC stream (or of anything with a
// Recv) on a goroutine of its own, as Envoy's side of an xDS or SDS stream
// does: the test then waits for the next response with a bound, and sees
// the error that ended the stream instead of blocking in Recv.
type Receiver[T any] struct {
	msgs chan T
	errc chan error
}

// NewReceiver calls recv on a goroutine until it fails. cancel must end
// the stream (the cancel of the stream's context): the end of the test
// calls it and waits for the goroutine, so that no test leaks one.
func NewReceiver[T any](t testing.TB, cancel context.CancelFunc, recv func() (T, error)) *Receiver[T] {
	r := &Receiver[T]{msgs: make(chan T, 100), errc: make(chan error, 1)}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := recv()
			if err != nil {
				r.errc <- err
				return
			}
			// A test that stopped reading must not keep the goroutine
			// blocked past its end.
			select {
			case r.msgs <- m:
			case <-stop:
				return
			}
		}
	}()
	t.Cleanup(func() { close(stop); cancel(); <-done })
	return r
}

// Next is the next response. It fails the test, naming what it waited
// for, when the stream ends first or nothing comes within Timeout.
func (r *Receiver[T]) Next(t testing.TB, what string) T {
	t.Helper()
	var zero T
	select {
	case m := <-r.msgs:
		return m
	case err := <-r.errc:
		t.Fatalf("stream ended waiting for %s: %v", what, err)
	case <-time.After(Timeout):
		t.Fatalf("timed out after %v waiting for %s", Timeout, what)
	}
	return zero
}

// Quiet checks that for d nothing comes and the stream stays up: after an
// event that must not cause a push. It fails the test, naming what, on a
// response (shown up to 500 characters) or the stream's end.
func (r *Receiver[T]) Quiet(t testing.TB, what string, d time.Duration) {
	t.Helper()
	select {
	case m := <-r.msgs:
		s := fmt.Sprint(m)
		if len(s) > 500 {
			s = s[:500] + "..."
		}
		t.Fatalf("unexpected response (%s): %s", what, s)
	case err := <-r.errc:
		t.Fatalf("stream ended (%s): %v", what, err)
	case <-time.After(d):
	}
}

// Err is the error that ended the stream, once it has.
func (r *Receiver[T]) Err() <-chan error { return r.errc }
