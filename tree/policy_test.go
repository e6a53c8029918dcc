package tree

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestPolicyDelayGrowsWithJitterToCap(t *testing.T) {
	p := DefaultPolicy()
	rng := rand.New(rand.NewPCG(1, 2))
	prevMax := time.Duration(0)
	for attempt := 1; attempt <= 20; attempt++ {
		full := p.FirstDelay
		for i := 1; i < attempt && full < p.MaxDelay; i++ {
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
	if d := p.delay(1, rng); d > 100*time.Millisecond {
		t.Fatalf("first restart delay %s, want at most 100ms", d)
	}
}

func TestPolicyValidate(t *testing.T) {
	bad := []Policy{
		{FirstDelay: -1, MaxDelay: 1, Multiplier: 2},
		{FirstDelay: 2, MaxDelay: 1, Multiplier: 2},
		{FirstDelay: 1, MaxDelay: 2, Multiplier: 0.5},
		{FirstDelay: 1, MaxDelay: 2, Multiplier: 2, GiveUp: &GiveUp{Restarts: -1, Window: time.Second}},
		{FirstDelay: 1, MaxDelay: 2, Multiplier: 2, GiveUp: &GiveUp{Restarts: 1}},
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
