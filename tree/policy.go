package tree

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Policy is how a service is restarted after it fails.
type Policy struct {
	// FirstDelay is the delay before the first restart (jittered down to
	// half of it), so a crash is repaired within about this long.
	FirstDelay time.Duration
	// MaxDelay caps the delay between restarts.
	MaxDelay time.Duration
	// Multiplier grows the delay after each consecutive failure.
	Multiplier float64
	// HealthyAfter: a run that lasted this long resets the consecutive
	// failure count, so the next failure restarts fast again.
	HealthyAfter time.Duration
	// GiveUp, if set, makes the agent exit when the service fails more
	// often than allowed.
	GiveUp *GiveUp
}

// GiveUp is a limit on restarts: more than Restarts failures within Window
// and the agent exits non-zero. Restarts 0 means the first failure ends the
// agent (Istio's behaviour for Envoy).
type GiveUp struct {
	Restarts int
	Window   time.Duration
}

// DefaultPolicy is the policy of every service unless the tree says otherwise.
func DefaultPolicy() Policy {
	return Policy{
		FirstDelay:   100 * time.Millisecond,
		MaxDelay:     30 * time.Second,
		Multiplier:   2,
		HealthyAfter: 30 * time.Second,
	}
}

// Validate reports a policy that cannot work.
func (p Policy) Validate() error {
	switch {
	case p.FirstDelay < 0:
		return fmt.Errorf("restart delay %s is negative", p.FirstDelay)
	case p.MaxDelay < p.FirstDelay:
		return fmt.Errorf("maximum restart delay %s is below the first delay %s", p.MaxDelay, p.FirstDelay)
	case p.Multiplier < 1:
		return fmt.Errorf("restart delay multiplier %g is below 1", p.Multiplier)
	case p.GiveUp != nil && p.GiveUp.Restarts < 0:
		return fmt.Errorf("restart limit %d is negative", p.GiveUp.Restarts)
	case p.GiveUp != nil && p.GiveUp.Window <= 0:
		return fmt.Errorf("restart limit window %s must be positive", p.GiveUp.Window)
	}
	return nil
}

// delay is the wait before restart number attempt (1 = the first restart
// after a failure). It is "equal jitter": half fixed, half random, so that
// services that failed together do not restart in lockstep.
func (p Policy) delay(attempt int, rng *rand.Rand) time.Duration {
	d := float64(p.FirstDelay)
	for i := 1; i < attempt && d < float64(p.MaxDelay); i++ {
		d *= p.Multiplier
	}
	if d > float64(p.MaxDelay) {
		d = float64(p.MaxDelay)
	}
	half := d / 2
	return time.Duration(half + rng.Float64()*half)
}
