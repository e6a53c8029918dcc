package stallwatch

import (
	"errors"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// The watchdog's rule: a stall is requests waiting (an unanswered initial
// request, or a blocked Send) with no sign of life for the timeout, and
// never while answers wait for Envoy.
func TestStallRule(t *testing.T) {
	clock := testkit.NewManualClock()
	w := NewWatch(time.Minute, clock.Now())
	stalled := func(delivering bool) error { return w.Stalled(clock.Now(), delivering) }

	clock.Advance(time.Hour)
	if err := stalled(false); err != nil {
		t.Fatalf("stalled with nothing waiting: %v", err)
	}
	w.Asked(clock.Now(), resource.ClusterType)
	if err := stalled(false); err != nil {
		t.Fatalf("stalled at once: %v", err)
	}
	// asked does not reset the clock: the last sign of life is old.
	w.SendStart(clock.Now())
	w.SendDone(clock.Now())
	clock.Advance(59 * time.Second)
	if err := stalled(false); err != nil {
		t.Fatalf("stalled before the timeout: %v", err)
	}
	clock.Advance(time.Second)
	var stall *Error
	if err := stalled(false); !errors.As(err, &stall) || len(stall.types) != 1 || stall.types[0] != resource.ClusterType {
		t.Fatalf("stalled() = %v, want a stall on CDS", err)
	}

	if err := stalled(true); err != nil {
		t.Fatalf("a slow Envoy counted as a stall: %v", err)
	}
	clock.Advance(30 * time.Second)
	if err := stalled(false); err != nil {
		t.Fatalf("delivering did not count as a sign of life: %v", err)
	}

	w.Answered(clock.Now(), resource.ClusterType)
	clock.Advance(time.Hour)
	if err := stalled(false); err != nil {
		t.Fatalf("stalled with every request answered: %v", err)
	}
	w.SendStart(clock.Now())
	clock.Advance(time.Minute)
	if err := stalled(false); !errors.As(err, &stall) || !stall.sending {
		t.Fatalf("a Send blocked for the timeout: %v, want a stall", err)
	}
	testkit.Contains(t, "stall message", stall.Error(), "cannot be sent", "57064")
}
