package testkit

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A Receiver hands over each response in order, then the error that ended
// the stream; its goroutine is gone at the end of the test (goleak checks)
// even when the test stopped reading.
func TestReceiver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	sent := make(chan int)
	recv := func() (int, error) {
		select {
		case v := <-sent:
			if v < 0 {
				return 0, errors.New("ended")
			}
			return v, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	r := NewReceiver(t, cancel, recv)
	sent <- 1
	sent <- 2
	if a, b := r.Next(t, "1"), r.Next(t, "2"); a != 1 || b != 2 {
		t.Fatalf("got %d, %d", a, b)
	}
	r.Quiet(t, "no third response", 10*time.Millisecond)
	sent <- -1
	if err := <-r.Err(); err == nil || err.Error() != "ended" {
		t.Fatalf("Err: %v", err)
	}

	// Unread responses do not keep the goroutine past the test.
	ctx2, cancel2 := context.WithCancel(context.Background())
	NewReceiver(t, cancel2, func() (int, error) {
		select {
		case <-ctx2.Done():
			return 0, ctx2.Err()
		default:
			return 7, nil
		}
	})
}
