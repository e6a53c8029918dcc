package main

import (
	"regexp"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// Envoy's JitteredExponentialBackOffStrategy: each delay is below the
// interval, which doubles up to max and comes back to base on reset.
func TestBackoffIsEnvoysJitteredExponential(t *testing.T) {
	b := newBackoff(nil)
	if b.base != 500*time.Millisecond || b.max != 30*time.Second {
		t.Fatalf("default backoff %v..%v; want Envoy's 500ms..30s", b.base, b.max)
	}
	var intervals []time.Duration
	for range 9 {
		interval := b.next
		if d := b.nextDelay(); d < 0 || d >= interval || d%time.Millisecond != 0 {
			t.Fatalf("delay %v for interval %v; want whole milliseconds in [0, interval)", d, interval)
		}
		intervals = append(intervals, interval)
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second,
		16 * time.Second, 30 * time.Second, 30 * time.Second, 30 * time.Second}
	if !slices.Equal(intervals, want) {
		t.Errorf("intervals %v; want %v", intervals, want)
	}
	b.reset()
	if b.next != b.base {
		t.Errorf("after reset the interval is %v; want %v", b.next, b.base)
	}

	// retry_policy.retry_back_off: max defaults to 10× base.
	src := &corev3.ApiConfigSource{GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
		EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "xds-grpc", RetryPolicy: &corev3.RetryPolicy{
			RetryBackOff: &corev3.BackoffStrategy{BaseInterval: durationpb.New(50 * time.Millisecond)}}}}}}}
	if b := newBackoff(src); b.base != 50*time.Millisecond || b.max != 500*time.Millisecond {
		t.Errorf("backoff with base_interval 50ms: %v..%v; want 50ms..500ms", b.base, b.max)
	}
}

var retryInterval = regexp.MustCompile(`cluster xds-grpc \(.*\): stream closed: .*; retrying in \S+ \(backoff interval (\S+)\)`)

// intervals are the backoff intervals the stand-in logged for xds-grpc, in
// order.
func intervals(log *testkit.LogBuffer) []string {
	var out []string
	for _, m := range retryInterval.FindAllStringSubmatch(log.String(), -1) {
		out = append(out, m[1])
	}
	return out
}

// As Envoy (#24): once the control plane is gone, each failed redial
// doubles the backoff interval up to its max (here the bootstrap's
// retry_policy: 20 ms, max 160 ms), and a response received on a stream
// resets it, so the next close is retried from the base again.
func TestXDSRedialBacksOffAndResetsOnAResponse(t *testing.T) {
	t.Parallel()
	f := newSDSFixture(t, `{"retry_back_off": {"base_interval": "0.02s", "max_interval": "0.16s"}}`)
	resources := map[resource.Type][]types.Resource{resource.ClusterType: {}, resource.ListenerType: {}}
	if err := f.x.SetResources("v1", resources); err != nil {
		t.Fatal(err)
	}
	p := f.hr.start(t, 0, nil)
	testkit.WaitFor(t, "/ready 200", func() bool { code, _ := f.ready(); return code == 200 })

	f.x.Stop()
	testkit.WaitFor(t, "five retries logged", func() bool { return len(intervals(p.log)) >= 5 })
	if got, want := intervals(p.log)[:5], []string{"20ms", "40ms", "80ms", "160ms", "160ms"}; !slices.Equal(got, want) {
		t.Fatalf("backoff intervals after the control plane went: %v; want %v\n%s", got, want, p.log)
	}

	back := f.restart(t, resources)
	testkit.WaitFor(t, "a response ACKed on the new stream", func() bool { return back.Stats().ACKs[resource.ClusterType] > 0 })
	n := len(intervals(p.log))
	back.Stop()
	testkit.WaitFor(t, "a retry logged after the second stop", func() bool { return len(intervals(p.log)) > n })
	if got := intervals(p.log)[n]; got != "20ms" {
		t.Errorf("backoff interval after a stream that got a response: %s; want the base, 20ms\n%s", got, p.log)
	}
}
