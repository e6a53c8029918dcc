package testkit

import (
	"context"
	"maps"
	"testing"
	"time"
)

// An Update from another goroutine wakes WaitFor; Get and WaitFor hand out
// copies, so a test that changes what it read changes nothing held.
func TestObserved(t *testing.T) {
	o := NewObserved(map[string]int{}, maps.Clone[map[string]int])
	go func() {
		for i := range 3 {
			time.Sleep(time.Millisecond)
			o.Update(func(m *map[string]int) { (*m)["n"] = i + 1 })
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if err := o.WaitFor(ctx, "observed", func(m map[string]int) bool { return m["n"] == 3 }); err != nil {
		t.Fatal(err)
	}
	got := o.Get()
	got["n"] = 99
	if o.Get()["n"] != 3 {
		t.Error("changing what Get returned changed the value held")
	}

	expired, cancel2 := context.WithCancel(context.Background())
	cancel2()
	err := o.WaitFor(expired, "observed", func(m map[string]int) bool { return m["n"] == 4 })
	if err == nil {
		t.Fatal("WaitFor on an ended context returned nil")
	}
	Contains(t, "error", err.Error(), "observed", "map[n:3]")
}
