package kube

import (
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// TestSinceStart reads each agent's certificate and ready lines in the
// kubelet's log files, and containerd's line for a container started, as
// the storm's table does.
func TestSinceStart(t *testing.T) {
	root := t.TempDir()
	logs := map[string]string{
		"storm-meshagent-0": "2026-11-29T03:04:57.42242353Z stderr F time=2026-11-29T03:04:57.349Z level=INFO msg=\"meshagent starting\"\n" +
			"2026-11-29T03:04:57.721407451Z stderr F time=2026-11-29T03:04:57.625Z level=INFO msg=\"certificate from CA\" service=certs\n" +
			"2026-11-29T03:04:58.1Z stderr F time=2026-11-29T03:04:58.1Z level=INFO msg=\"agent ready\"\n",
		"storm-istio-0": "2026-11-29T03:03:43.851037973Z stderr F 2026/11/29 03:03:43 INFO GOMEMLIMIT is already set\n" +
			"2026-11-29T03:03:46.38380046Z stdout F 2026-11-29T03:03:46.383718Z\tinfo\tcache\tgenerated new workload certificate\tresourceName=default latency=2.023511063s\n" +
			"2026-11-29T03:03:47Z stdout F 2026-11-29T03:03:46.9Z\tinfo\tEnvoy proxy is ready\n",
		"storm-istio-1": "2026-11-29T03:03:43.851037973Z stderr F no certificate yet\n",
	}
	for pod, log := range logs {
		testkit.WriteFile(t, filepath.Join(root, "pod-logs", testNS+"_"+pod+"_uid", "istio-proxy", "0.log"), []byte(log))
	}
	m := containerStarted.FindStringSubmatch(`time="2026-11-29T03:04:57.4Z" level=info msg="StartContainer for \"39329259f6fd\" returns successfully"`)
	if m == nil || m[1] != "2026-11-29T03:04:57.4Z" || m[2] != "39329259f6fd" {
		t.Fatalf("containerd's line: %q", m)
	}
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	starts := map[string]time.Time{
		"storm-meshagent-0": at("2026-11-29T03:04:57.4Z"),
		"storm-istio-0":     at("2026-11-29T03:03:43.5Z"),
		"storm-istio-1":     at("2026-11-29T03:03:43.5Z"),
	}
	s := &suite{n: &node{root: root}}
	for _, c := range []struct {
		label string
		line  *regexp.Regexp
		want  []time.Duration
	}{
		{"storm-meshagent", certificateLine, []time.Duration{321407451 * time.Nanosecond}},
		{"storm-meshagent", readyLine, []time.Duration{700 * time.Millisecond}},
		{"storm-istio", certificateLine, []time.Duration{2883800460 * time.Nanosecond}}, // pod 1 has none
		{"storm-istio", readyLine, []time.Duration{3500 * time.Millisecond}},
	} {
		if got := between(starts, firstMatch(s.sidecarLogs(c.label, 2), c.line)); !slices.Equal(got, c.want) {
			t.Errorf("%s, %v: %v, want %v", c.label, c.line, got, c.want)
		}
	}

	// After the ready line: the application container's start, then the
	// pod's Ready; a pod whose application has not started counts in
	// neither.
	apps := map[string]time.Time{"storm-istio-0": at("2026-11-29T03:03:48.25Z")}
	readyAt := map[string]time.Time{"storm-istio-0": at("2026-11-29T03:03:49Z"), "storm-istio-1": at("2026-11-29T03:03:50Z")}
	agentReady := firstMatch(s.sidecarLogs("storm-istio", 2), readyLine)
	sidecarToApp, toApp, toReady := between(starts, apps), between(agentReady, apps), between(apps, readyAt)
	if want := []time.Duration{4750 * time.Millisecond}; !slices.Equal(sidecarToApp, want) {
		t.Errorf("sidecar started → app started: %v, want %v", sidecarToApp, want)
	}
	if want := []time.Duration{1250 * time.Millisecond}; !slices.Equal(toApp, want) {
		t.Errorf("ready line → app started: %v, want %v", toApp, want)
	}
	if want := []time.Duration{750 * time.Millisecond}; !slices.Equal(toReady, want) {
		t.Errorf("app started → Ready: %v, want %v", toReady, want)
	}
}

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
	ms := func(ms ...int) []time.Duration {
		var out []time.Duration
		for _, m := range ms {
			out = append(out, time.Duration(m)*time.Millisecond)
		}
		return out
	}
	for _, c := range []struct {
		times []time.Duration
		want  int
	}{
		{nil, 0},
		{ms(0), 1},
		{ms(0, 99, 100, 150, 199, 400), 3}, // 99, 100, 150 or 100, 150, 199
		{ms(0, 100, 200, 300), 1},
	} {
		if got := mostWithin(c.times, 100*time.Millisecond); got != c.want {
			t.Errorf("mostWithin(%v) = %d, want %d", c.times, got, c.want)
		}
	}

	// From istiod's log file: each pod's first stream after the restart,
	// other storms' pods and other lines left out.
	root := t.TempDir()
	log := "2026-11-29T02:13:37.5Z\tinfo\tdelta\tADS: new delta connection for node:storm-meshagent-1.e2e-1\n" +
		"2026-11-29T02:13:37.2Z\tinfo\tads\tPush debounce stable[1] 14\n" +
		"2026-11-29T02:13:37.6Z\tinfo\tdelta\tADS: new delta connection for node:storm-istio-1.e2e-2\n" +
		"2026-11-29T02:13:37.7Z\tinfo\tdelta\tADS: new delta connection for node:storm-meshagent-0.e2e-3\n" +
		"2026-11-29T02:13:39Z\tinfo\tdelta\tADS: new delta connection for node:storm-meshagent-1.e2e-4\n"
	testkit.WriteFile(t, filepath.Join(root, "logs", "istiod.log"), []byte(log))
	restart, err := time.Parse(time.RFC3339, "2026-11-29T02:13:37Z")
	if err != nil {
		t.Fatal(err)
	}
	s := &suite{n: &node{istioRoot: root}}
	if got, want := s.reconnects(t, "storm-meshagent", restart), ms(500, 700); !slices.Equal(got, want) {
		t.Errorf("reconnects: %v, want %v", got, want)
	}
}

// A pod's log is read from its own UID's directory: a namesake deleted a
// moment before (the storm before, of the same agent) may still have one,
// with lines minutes older.
func TestContainerLogReadsThePodsOwnDirectory(t *testing.T) {
	root := t.TempDir()
	for uid, line := range map[string]string{"old-uid": "2026-11-29T06:04:10Z stderr F old\n", "new-uid": "2026-11-29T06:07:10Z stderr F new\n"} {
		testkit.WriteFile(t, filepath.Join(root, "pod-logs", testNS+"_storm-meshagent-0_"+uid, "istio-proxy", "0.log"), []byte(line))
	}
	s := &suite{n: &node{root: root}, uids: map[string]string{"storm-meshagent-0": "new-uid"}}
	if got := s.sidecarLog("storm-meshagent-0"); got != "2026-11-29T06:07:10Z stderr F new\n" {
		t.Errorf("the pod's log: %q, want its own directory's alone", got)
	}
}
