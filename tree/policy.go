package tree

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Policy is how a service is restarted after it fails.
//
// The first failure after a healthy run restarts at once; the following
// ones wait BaseDelay, growing by Multiplier to MaxDelay, with jitter. This
// holds for every service, not only Envoy. A crash of Envoy is an outage for
// the pod (its traffic stops), but so, more quietly, is one of the DNS proxy
// (the application's lookups fail), SDS (new connections cannot get
// certificates) or the status server (kubelet's probes fail): for each, the
// first restart is the one most likely to succeed (the fault was transient)
// and the cheapest to try (an in-process goroutine, or one exec). What a
// delay buys is pacing of a crash loop, and that starts with the second
// consecutive failure: a service that fails as it starts is tried twice in
// quick succession, then waits 50-100 ms, then 100-200 ms, and so on.
type Policy struct {
	// BaseDelay is the delay before the second consecutive restart
	// (jittered down to half of it); the first is immediate.
	BaseDelay time.Duration
	// MaxDelay caps the delay between restarts.
	MaxDelay time.Duration
	// Multiplier grows the delay after each consecutive failure.
	Multiplier float64
	// HealthyAfter: a run that lasted this long resets the consecutive
	// failure count, so the next failure restarts at once again.
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
		BaseDelay:    100 * time.Millisecond,
		MaxDelay:     30 * time.Second,
		Multiplier:   2,
		HealthyAfter: 30 * time.Second,
	}
}

// Validate reports a policy that cannot work.
func (p Policy) Validate() error {
	switch {
	case p.BaseDelay < 0:
		return fmt.Errorf("restart delay %s is negative", p.BaseDelay)
	case p.MaxDelay < p.BaseDelay:
		return fmt.Errorf("maximum restart delay %s is below the base delay %s", p.MaxDelay, p.BaseDelay)
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
// after a healthy run, which is immediate). From the second on it is "equal
// jitter": half fixed, half random, so that services that failed together
// do not restart in lockstep.
func (p Policy) delay(attempt int, rng *rand.Rand) time.Duration {
	if attempt <= 1 {
		return 0
	}
	d := float64(p.BaseDelay)
	for i := 2; i < attempt && d < float64(p.MaxDelay); i++ {
		d *= p.Multiplier
	}
	if d > float64(p.MaxDelay) {
		d = float64(p.MaxDelay)
	}
	half := d / 2
	return time.Duration(half + rng.Float64()*half)
}
