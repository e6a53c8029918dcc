package tree

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/thejerf/suture/v4"
	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A service that panics is restarted: the panic shows in /debug/tree and
// in the counters, and the service is back and ready.
func TestPanicIsRestartedAndVisible(t *testing.T) {
	ch := NewChannels(nil)
	svc := &readyService{name: "ticker", health: ch.Health, panicAfter: 50 * time.Millisecond}
	h := newHarnessWith(t, ch, []Node{{Name: "ticker", Service: svc}}, Options{}, []string{"ticker"})

	testkit.WaitFor(t, "second run of the panicking service", func() bool { return svc.runs.Load() >= 2 })
	h.waitStatus("/healthz/ready", 200)

	var tree struct {
		Ready    bool                   `json:"ready"`
		Services []messages.ServiceInfo `json:"services"`
	}
	testkit.WaitFor(t, "panic recorded in /debug/tree", func() bool {
		_, body := h.get("/debug/tree?format=json")
		if err := json.Unmarshal([]byte(body), &tree); err != nil {
			t.Fatalf("bad /debug/tree JSON: %v\n%s", err, body)
		}
		for _, s := range tree.Services {
			if s.Name == "ticker" {
				return s.Panics == 1 && s.Restarts == 1 && strings.Contains(s.LastError, "boom from ticker")
			}
		}
		return false
	})
	_, text := h.get("/debug/tree")
	if !strings.Contains(text, "ticker") || !strings.Contains(text, "panic: boom from ticker") {
		t.Fatalf("text /debug/tree lacks the panic:\n%s", text)
	}
	if got := h.counter("meshagent_service_panics_total", "ticker"); got != 1 {
		t.Fatalf("panics counter = %v, want 1", got)
	}
	if got := h.counter("meshagent_service_restarts_total", "ticker"); got != 1 {
		t.Fatalf("restarts counter = %v, want 1", got)
	}
	_, metrics := h.get("/stats/prometheus")
	if !strings.Contains(metrics, `istio_agent_meshagent_service_restarts_total{service="ticker"} 1`) {
		t.Fatalf("/stats/prometheus lacks the restart counter:\n%s", metrics)
	}
}

// A service that fails past its give-up limit ends the agent with an error
// that names it. Restarts 0 is Istio's behaviour: the first failure ends
// the agent.
func TestGiveUpEndsTheAgent(t *testing.T) {
	for _, restarts := range []int{3, 0} {
		t.Run(fmt.Sprintf("restarts=%d", restarts), func(t *testing.T) {
			bad := &failingService{name: "crasher"}
			limit := fastPolicy()
			limit.GiveUp = &GiveUp{Restarts: restarts, Window: time.Minute}
			a, err := New(NewChannels(nil), []Node{{Name: "crasher", Service: bad, Policy: limit}}, prometheus.NewRegistry(), testkit.TestLogger(t), Options{})
			if err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() { errc <- a.Run(context.Background()) }()
			var runErr error
			select {
			case runErr = <-errc:
			case <-time.After(testkit.Timeout):
				t.Fatal("agent did not give up")
			}
			var gu *GiveUpError
			if !errors.As(runErr, &gu) {
				t.Fatalf("Run = %v, want a *GiveUpError", runErr)
			}
			if gu.Service != "crasher" || gu.Failures != restarts+1 || !errors.Is(runErr, errFake) {
				t.Fatalf("give-up = %+v", gu)
			}
			if got := bad.runs.Load(); got != int32(restarts+1) {
				t.Fatalf("service ran %d times, want %d (%d restarts)", got, restarts+1, restarts)
			}
		})
	}
}

// A chaos kill makes readiness fail, then the restarted service makes it
// pass again.
func TestChaosKillThenReadyAgain(t *testing.T) {
	ch := NewChannels(nil)
	gate := make(chan struct{})
	svc := &readyService{name: "dns", health: ch.Health, gate: gate}
	h := newHarnessWith(t, ch, []Node{{Name: "names", Children: []Node{{Name: "dns", Service: svc}}}}, Options{}, []string{"dns"})
	h.waitStatus("/healthz/ready", 200)

	if code, body := h.post("/debug/chaos/kill?service=dns"); code != 200 {
		t.Fatalf("chaos kill = %d %s", code, body)
	}
	body := h.waitStatus("/healthz/ready", 503)
	if !strings.Contains(body, "dns") {
		t.Fatalf("503 body does not name the service: %q", body)
	}
	close(gate)
	h.waitStatus("/healthz/ready", 200)
	if got := svc.runs.Load(); got != 2 {
		t.Fatalf("service ran %d times, want 2", got)
	}
	if got := h.counter("meshagent_service_restarts_total", "dns"); got != 1 {
		t.Fatalf("restarts counter = %v, want 1", got)
	}
	if code, _ := h.post("/debug/chaos/kill?service=nosuch"); code != 404 {
		t.Fatalf("chaos kill of an unknown service = %d, want 404", code)
	}
	if code, _ := h.get("/debug/chaos/kill?service=dns"); code != 405 {
		t.Fatalf("GET chaos kill = %d, want 405", code)
	}
}

// The tree speaks sd_notify: READY=1 once ready, STOPPING=1 on shutdown.
func TestSystemdNotify(t *testing.T) {
	conn := notifySocket(t)

	ch := NewChannels(nil)
	svc := &readyService{name: "svc", health: ch.Health}
	h := newHarnessWith(t, ch, []Node{{Name: "svc", Service: svc}}, Options{Notifier: SystemdNotifier{}}, []string{"svc"})
	if got := readNotify(t, conn); got != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	h.stop()
	if got := readNotify(t, conn); got != "STOPPING=1" {
		t.Fatalf("second notification %q, want STOPPING=1", got)
	}
}

// notifySocket is systemd's end of sd_notify, named by NOTIFY_SOCKET for
// the rest of the test.
func notifySocket(t *testing.T) *net.UnixConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", sock)
	return conn
}

func readNotify(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 256)
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("reading sd_notify: %v", err)
	}
	return string(buf[:n])
}

// fakeEnvoy stands for the envoy service: it drains on a Drain command and
// records whether any other service had been stopped by then.
type fakeEnvoy struct {
	drain      messages.Source[messages.Drain]
	state      messages.Sink[messages.EnvoyState]
	other      *readyService
	otherAlive func() bool
	sawAlive   chan bool
}

func (f *fakeEnvoy) String() string { return "envoy" }
func (f *fakeEnvoy) Serve(ctx context.Context) error {
	f.state.Send(messages.EnvoyState{Phase: messages.EnvoyReady})
	select {
	case <-f.drain.Ready():
		f.drain.Take()
		f.sawAlive <- f.otherAlive()
		f.state.Send(messages.EnvoyState{Phase: messages.EnvoyStopped})
		return suture.ErrDoNotRestart
	case <-ctx.Done():
		f.sawAlive <- false
		return ctx.Err()
	}
}

// A graceful stop drains Envoy while the rest of the tree still runs.
func TestShutdownDrainsEnvoyFirst(t *testing.T) {
	ch := NewChannels(nil)
	other := &stoppable{name: "sds", health: ch.Health}
	fe := &fakeEnvoy{drain: ch.Drain, state: ch.Envoy, otherAlive: other.alive, sawAlive: make(chan bool, 1)}
	h := newHarnessWith(t, ch, []Node{{Name: "sds", Service: other}, {Name: "envoy", Service: fe}}, Options{}, []string{"sds"})
	h.waitStatus("/healthz/ready", 200)
	h.stop()
	select {
	case alive := <-fe.sawAlive:
		if !alive {
			t.Fatal("sds was stopped before Envoy drained")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Envoy was never asked to drain")
	}
	if err := h.waitRun("the agent to stop after the drain"); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

type stoppable struct {
	name    string
	health  messages.Sink[messages.Health]
	running chan struct{}
}

func (s *stoppable) String() string { return s.name }
func (s *stoppable) alive() bool    { return !testkit.Closed(s.running) }
func (s *stoppable) Serve(ctx context.Context) error {
	s.running = make(chan struct{})
	s.health.Send(messages.Health{Service: s.name, State: messages.Ready})
	<-ctx.Done()
	close(s.running)
	return ctx.Err()
}

// /quitquitquit stops the agent at once, loopback only.
func TestQuitQuitQuit(t *testing.T) {
	ch := NewChannels(nil)
	h := newHarnessWith(t, ch, nil, Options{}, nil)
	h.waitStatus("/healthz/ready", 200)
	if code, _ := h.get("/quitquitquit"); code != 405 {
		t.Fatalf("GET /quitquitquit = %d, want 405", code)
	}
	if code, body := h.post("/quitquitquit"); code != 200 || !strings.Contains(body, "OK") {
		t.Fatalf("POST /quitquitquit = %d %q", code, body)
	}
	if err := h.waitRun("the agent to stop on /quitquitquit"); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

// A group killed restarts as a whole: a fresh supervisor,
// every child run again.
func TestSubtreeRebuild(t *testing.T) {
	ch := NewChannels(nil)
	a1 := &readyService{name: "nametable", health: ch.Health}
	a2 := &readyService{name: "dns", health: ch.Health}
	h := newHarnessWith(t, ch, []Node{{Name: "names",
		Children: []Node{{Name: "nametable", Service: a1}, {Name: "dns", Service: a2}}}}, Options{}, []string{"dns", "nametable"})
	h.waitStatus("/healthz/ready", 200)
	h.ch.Chaos.Send(messages.Chaos{Service: "names"})
	testkit.WaitFor(t, "both children run again", func() bool { return a1.runs.Load() == 2 && a2.runs.Load() == 2 })
	h.waitStatus("/healthz/ready", 200)
	if got := h.counter("meshagent_service_restarts_total", "names"); got != 1 {
		t.Fatalf("names restarts = %v, want 1", got)
	}
	if got := h.counter("meshagent_service_restarts_total", "dns"); got != 0 {
		t.Fatalf("dns restarts = %v, want 0 (it was rebuilt, not failed)", got)
	}
}

func TestNewRejectsBadTrees(t *testing.T) {
	svc := &failingService{name: "a"}
	cases := map[string][]Node{
		"duplicate":  {{Name: "a", Service: svc}, {Name: "a", Service: svc}},
		"no name":    {{Children: []Node{{Service: svc}}}},
		"renamed":    {{Name: "b", Service: svc}},
		"misreports": {{Service: svc, Health: messages.NewReporter("b", messages.NewStream[messages.Health](0, nil), nil)}},
		"empty":      {{Name: "g"}},
		"reserved":   {{Name: "agent", Service: svc}},
		"bad policy": {{Name: "a", Service: svc, Policy: &Policy{BaseDelay: time.Second, MaxDelay: time.Millisecond, Multiplier: 2}}},
	}
	for name, nodes := range cases {
		if _, err := New(NewChannels(nil), nodes, prometheus.NewRegistry(), testkit.TestLogger(t), Options{}); err == nil {
			t.Errorf("%s: New accepted %+v", name, nodes)
		}
	}
}

// With WATCHDOG_USEC set, the tree pings systemd's watchdog at half the
// interval while its loop runs.
func TestSystemdWatchdog(t *testing.T) {
	conn := notifySocket(t)
	t.Setenv("WATCHDOG_USEC", "100000")

	ch := NewChannels(nil)
	newHarnessWith(t, ch, []Node{{Name: "svc", Service: &readyService{name: "svc", health: ch.Health}}},
		Options{Notifier: SystemdNotifier{}}, []string{"svc"})
	pings := 0
	for pings < 3 {
		if readNotify(t, conn) == "WATCHDOG=1" {
			pings++
		}
	}
}

// Health events dropped by a status server that fell behind are counted in
// meshagent_health_events_dropped_total.
func TestDroppedHealthEventsAreCounted(t *testing.T) {
	ch := NewChannels(nil)
	reg := prometheus.NewRegistry()
	if _, err := New(ch, nil, reg, testkit.TestLogger(t), Options{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < messages.DefaultStreamBound+6; i++ {
		ch.Health.Send(messages.Health{Service: "x"})
	}
	if got := testkit.MetricValue(t, reg, "meshagent_health_events_dropped_total"); got != 6 {
		t.Fatalf("meshagent_health_events_dropped_total = %v, want 6", got)
	}
}
