package kube

import (
	"testing"
	"time"
)

// TestReconnectArrivals reads istiod's lines for new ADS streams, SotW and
// Delta, as the reconnect storm does, and counts the most in a window.
func TestReconnectArrivals(t *testing.T) {
	for line, want := range map[string]string{
		"2026-11-29T02:13:37.060977Z\tinfo\tdelta\tADS: new delta connection for node:storm-meshagent-7.e2e-1": "storm-meshagent-7",
		"2026-11-29T02:13:37.060977Z\tinfo\tads\tADS: new connection for node:storm-istio-12.e2e-31":           "storm-istio-12",
		"2026-11-29T02:13:37.060977Z\tinfo\tads\tPush debounce stable[1] 14":                                   "",
	} {
		m := newConnection.FindStringSubmatch(line)
		if got := ""; m != nil {
			got = m[2]
			if got != want {
				t.Errorf("%q: pod %q, want %q", line, got, want)
			}
		} else if want != "" {
			t.Errorf("%q: no match, want pod %q", line, want)
		}
	}
	t0 := time.Unix(0, 0)
	at := func(ms ...int) []time.Time {
		var out []time.Time
		for _, m := range ms {
			out = append(out, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return out
	}
	for _, c := range []struct {
		times []time.Time
		want  int
	}{
		{nil, 0},
		{at(0), 1},
		{at(0, 99, 100, 150, 199, 400), 3}, // 99, 100, 150 or 100, 150, 199
		{at(0, 100, 200, 300), 1},
	} {
		if got := mostWithin(c.times, 100*time.Millisecond); got != c.want {
			t.Errorf("mostWithin(%v) = %d, want %d", c.times, got, c.want)
		}
	}
}
