package xdsproxy

import (
	"errors"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// The watchdog's rule: a stall is requests waiting (an unanswered initial
// request, or a blocked Send) with no sign of life for the timeout, and
// never while answers wait for Envoy.
func TestStallRule(t *testing.T) {
	clock := testkit.NewManualClock()
	w := newStallWatch(time.Minute, clock.Now())
	stalled := func(delivering bool) error { return w.stalled(clock.Now(), delivering) }

	clock.Advance(time.Hour)
	if err := stalled(false); err != nil {
		t.Fatalf("stalled with nothing waiting: %v", err)
	}
	w.asked(clock.Now(), clusterType)
	if err := stalled(false); err != nil {
		t.Fatalf("stalled at once: %v", err)
	}
	// asked does not reset the clock: the last sign of life is old.
	w.sendStart(clock.Now())
	w.sendDone(clock.Now())
	clock.Advance(59 * time.Second)
	if err := stalled(false); err != nil {
		t.Fatalf("stalled before the timeout: %v", err)
	}
	clock.Advance(time.Second)
	var stall *stallError
	if err := stalled(false); !errors.As(err, &stall) || len(stall.types) != 1 || stall.types[0] != clusterType {
		t.Fatalf("stalled() = %v, want a stall on CDS", err)
	}

	if err := stalled(true); err != nil {
		t.Fatalf("a slow Envoy counted as a stall: %v", err)
	}
	clock.Advance(30 * time.Second)
	if err := stalled(false); err != nil {
		t.Fatalf("delivering did not count as a sign of life: %v", err)
	}

	w.answered(clock.Now(), clusterType)
	clock.Advance(time.Hour)
	if err := stalled(false); err != nil {
		t.Fatalf("stalled with every request answered: %v", err)
	}
	w.sendStart(clock.Now())
	clock.Advance(time.Minute)
	if err := stalled(false); !errors.As(err, &stall) || !stall.sending {
		t.Fatalf("a Send blocked for the timeout: %v, want a stall", err)
	}
	testkit.Contains(t, "stall message", stall.Error(), "cannot be sent", "57064")
}

// Which requests a control plane must answer: wildcard subscriptions that
// acknowledge nothing; never ACKs, never requests naming resources.
func TestAwaitsAnswer(t *testing.T) {
	s, d := sotw{}, delta{}
	for _, tc := range []struct {
		req  *discoveryv3.DiscoveryRequest
		want bool
	}{
		{&discoveryv3.DiscoveryRequest{TypeUrl: clusterType}, true},
		{&discoveryv3.DiscoveryRequest{TypeUrl: clusterType, VersionInfo: "v1"}, true},
		{&discoveryv3.DiscoveryRequest{TypeUrl: clusterType, VersionInfo: "v1", ResponseNonce: "n"}, false},
		{&discoveryv3.DiscoveryRequest{TypeUrl: endpointType, ResourceNames: []string{"a"}}, false},
		{&discoveryv3.DiscoveryRequest{TypeUrl: endpointType, ResourceNames: []string{"*"}}, true},
	} {
		if got := s.awaitsAnswer(tc.req); got != tc.want {
			t.Errorf("sotw %v: %v, want %v", tc.req, got, tc.want)
		}
	}
	for _, tc := range []struct {
		req  *discoveryv3.DeltaDiscoveryRequest
		want bool
	}{
		{&discoveryv3.DeltaDiscoveryRequest{TypeUrl: clusterType}, true},
		{&discoveryv3.DeltaDiscoveryRequest{TypeUrl: clusterType, ResponseNonce: "n"}, false},
		{&discoveryv3.DeltaDiscoveryRequest{TypeUrl: endpointType, ResourceNamesSubscribe: []string{"a"}}, false},
	} {
		if got := d.awaitsAnswer(tc.req); got != tc.want {
			t.Errorf("delta %v: %v, want %v", tc.req, got, tc.want)
		}
	}
}
