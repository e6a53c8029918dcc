package messages

import (
	"fmt"
	"testing"
)

// Every enum constant has its own name, and a value past the table prints
// as fmt would print the bare number with its type, never a wrong word.
func TestEnumNames(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{Degraded.String(), "degraded"},
		{Stopped.String(), "stopped"},
		{HealthState(9).String(), "HealthState(9)"},
		{HealthState(-1).String(), "HealthState(-1)"},
		{EnvoyStarting.String(), "starting"},
		{EnvoyStopped.String(), "stopped"},
		{EnvoyPhase(6).String(), "EnvoyPhase(6)"},
		{XDSServingCache.String(), "serving cached configuration"},
		{XDSUpstream(5).String(), "XDSUpstream(5)"},
		{fmt.Sprint(EnvoyDraining), "draining"},
	} {
		if tc.got != tc.want {
			t.Errorf("String() = %q, want %q", tc.got, tc.want)
		}
	}
	seen := map[string]bool{}
	for s := Starting; s <= Stopped; s++ {
		if seen[s.String()] {
			t.Errorf("two health states named %q", s)
		}
		seen[s.String()] = true
	}
}
