package status

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// startup_duration_seconds is Istio's: served as
// istio_agent_startup_duration_seconds, absent until the agent is first
// ready, then the time from the status server's construction (the agent's
// start) to that moment, and never recorded again.
func TestStartupDurationIsRecordedAtFirstReadiness(t *testing.T) {
	clock := testkit.NewManualClock() // nothing in this test waits on it: After would never fire
	f := newFixture(Config{})         // the channels
	reg := prometheus.NewRegistry()
	in := f.svc.in
	in.Required, in.Metrics = []string{"sds"}, reg
	svc, err := New(Config{Addr: "127.0.0.1:0"}, in, f.svc.out,
		messages.NewRuntime(Name, f.health, clock, reg, nil))
	if err != nil {
		t.Fatal(err)
	}
	f.svc = svc
	base := f.serve(t)
	startup := func() (float64, bool) {
		_, body := scrape(t, base+"/stats/prometheus", nil)
		fams := parseText(t, body)
		if _, ok := fams["istio_agent_startup_duration_seconds"]; !ok {
			return 0, false
		}
		return testkit.MetricSample(t, fams, "istio_agent_startup_duration_seconds"), true
	}
	ready := func(want int) {
		t.Helper()
		testkit.WaitFor(t, fmt.Sprintf("readiness %d", want), func() bool { c, _ := get(t, base+"/healthz/ready"); return c == want })
	}

	clock.Advance(2500 * time.Millisecond)
	ready(503)
	if v, ok := startup(); ok {
		t.Fatalf("not ready yet, but startup_duration_seconds = %v", v)
	}
	f.health.Send(messages.Health{Service: "sds", State: messages.Ready})
	ready(200) // the metric is set before /healthz/ready can answer 200
	if v, ok := startup(); !ok || v != 2.5 {
		t.Fatalf("at the first readiness: startup_duration_seconds = %v (present %v), want 2.5", v, ok)
	}

	clock.Advance(time.Minute)
	f.health.Send(messages.Health{Service: "sds", State: messages.Failed, Reason: "socket gone"})
	ready(503)
	f.health.Send(messages.Health{Service: "sds", State: messages.Ready})
	ready(200)
	if v, _ := startup(); v != 2.5 {
		t.Fatalf("ready again after a failure: startup_duration_seconds = %v, want the first 2.5", v)
	}
}
