package tree

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The first restart after a healthy run is immediate; from the second
// consecutive failure the delay grows from BaseDelay, with jitter, to the cap.
func TestPolicyDelayImmediateThenGrowsWithJitterToCap(t *testing.T) {
	p := DefaultPolicy()
	rng := rand.New(rand.NewPCG(1, 2))
	if d := p.delay(1, rng); d != 0 {
		t.Fatalf("first restart delay %s, want 0 (immediate)", d)
	}
	prevMax := time.Duration(0)
	for attempt := 2; attempt <= 20; attempt++ {
		full := p.BaseDelay
		for i := 2; i < attempt && full < p.MaxDelay; i++ {
			full *= 2
		}
		if full > p.MaxDelay {
			full = p.MaxDelay
		}
		for i := 0; i < 100; i++ {
			d := p.delay(attempt, rng)
			if d < full/2 || d > full {
				t.Fatalf("attempt %d: delay %s outside [%s, %s]", attempt, d, full/2, full)
			}
		}
		if full < prevMax {
			t.Fatalf("attempt %d: ceiling %s shrank from %s", attempt, full, prevMax)
		}
		prevMax = full
	}
	if prevMax != p.MaxDelay {
		t.Fatalf("ceiling after 20 attempts = %s, want the cap %s", prevMax, p.MaxDelay)
	}
	if d := p.delay(2, rng); d < p.BaseDelay/2 || d > p.BaseDelay {
		t.Fatalf("second restart delay %s, want within [%s, %s]", d, p.BaseDelay/2, p.BaseDelay)
	}
}

func TestPolicyValidate(t *testing.T) {
	bad := []Policy{
		{BaseDelay: -1, MaxDelay: 1, Multiplier: 2},
		{BaseDelay: 2, MaxDelay: 1, Multiplier: 2},
		{BaseDelay: 1, MaxDelay: 2, Multiplier: 0.5},
		{BaseDelay: 1, MaxDelay: 2, Multiplier: 2, GiveUp: &GiveUp{Restarts: -1, Window: time.Second}},
		{BaseDelay: 1, MaxDelay: 2, Multiplier: 2, GiveUp: &GiveUp{Restarts: 1}},
	}
	for i, p := range bad {
		if p.Validate() == nil {
			t.Errorf("policy %d (%+v) validated", i, p)
		}
	}
	if err := DefaultPolicy().Validate(); err != nil {
		t.Fatalf("default policy: %v", err)
	}
}
