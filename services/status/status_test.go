package status

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixture struct {
	svc    *Service
	health *messages.Stream[messages.Health]
	envoy  *messages.Cell[messages.EnvoyState]
	tree   *messages.Cell[messages.TreeState]
	ready  *messages.Cell[messages.Readiness]
	drain  *messages.Stream[messages.Drain]
	stop   *messages.Stream[messages.Shutdown]
	chaos  *messages.Stream[messages.Chaos]
	reg    *prometheus.Registry
}

func newFixture(cfg Config) *fixture { return newFixtureIn(cfg, Inputs{}) }

// newFixtureIn is newFixture with what the tree hands the server besides
// its channels: in's Required, RequireEnvoy, Debug and Metrics (nil: the
// fixture's registry).
func newFixtureIn(cfg Config, in Inputs) *fixture {
	f := &fixture{
		health: messages.NewStream[messages.Health](0, nil),
		envoy:  messages.NewCell[messages.EnvoyState](),
		tree:   messages.NewCell[messages.TreeState](),
		ready:  messages.NewCell[messages.Readiness](),
		drain:  messages.NewStream[messages.Drain](0, nil),
		stop:   messages.NewStream[messages.Shutdown](0, nil),
		chaos:  messages.NewStream[messages.Chaos](0, nil),
		reg:    prometheus.NewRegistry(),
	}
	if in.Metrics == nil {
		in.Metrics = f.reg
	}
	in.Health, in.Envoy, in.Tree = f.health, f.envoy, f.tree
	f.svc = mustNew(cfg, in,
		Outputs{Readiness: f.ready, Drain: f.drain, Shutdown: f.stop, Chaos: f.chaos}, nil)
	return f
}

// mustNew is New with a test Runtime whose metrics go to the registry the
// server also serves, as the tree does; log nil discards.
func mustNew(cfg Config, in Inputs, out Outputs, log *slog.Logger) *Service {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0" // serve picks a free port; New checks there is an address
	}
	reg, _ := in.Metrics.(prometheus.Registerer)
	health, _ := in.Health.(messages.Sink[messages.Health])
	svc, err := New(cfg, in, out, messages.NewRuntime(Name, health, nil, reg, log))
	if err != nil {
		panic(err)
	}
	return svc
}

// serve runs the service on a free port and returns its base URL.
func (f *fixture) serve(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	f.svc.cfg.Addr = addr
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.svc.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Serve = %v, want context.Canceled", err)
		}
	})
	base := "http://" + addr
	testkit.WaitFor(t, "the status server to answer on "+addr, func() bool {
		resp, err := client.Get(base + "/healthz/ready")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	return base
}

// client keeps no idle connections, so goleak sees none after a test.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	return getWithHeader(t, url, nil)
}

// Readiness needs every required service and Envoy; the 503 body says why.
func TestReadinessFollowsHealthAndEnvoy(t *testing.T) {
	f := newFixtureIn(Config{}, Inputs{Required: []string{"sds", "dns"}, RequireEnvoy: true})
	base := f.serve(t)

	code, body := get(t, base+"/healthz/ready")
	if code != 503 || !strings.Contains(body, "dns: no report yet") || !strings.Contains(body, "envoy: not running") {
		t.Fatalf("initial: %d %q", code, body)
	}
	f.health.Send(messages.Health{Service: "sds", State: messages.Ready})
	f.health.Send(messages.Health{Service: "dns", State: messages.Starting, Reason: "DNS lookup table is not ready yet"})
	f.envoy.Send(messages.EnvoyState{Phase: messages.EnvoyReady})
	testkit.WaitFor(t, "readiness to name only the DNS table", func() bool {
		_, body := get(t, base+"/healthz/ready")
		return strings.Contains(body, "DNS lookup table is not ready yet") && !strings.Contains(body, "envoy")
	})
	f.health.Send(messages.Health{Service: "dns", State: messages.Degraded, Reason: "stale table"})
	testkit.WaitFor(t, "readiness 200 with dns degraded", func() bool { c, _ := get(t, base+"/healthz/ready"); return c == 200 })
	if r, _ := f.ready.Get(); !r.Ready {
		t.Fatalf("Readiness value = %+v, want ready", r)
	}

	f.envoy.Send(messages.EnvoyState{Phase: messages.EnvoyExited, ExitReason: "signal: killed"})
	testkit.WaitFor(t, "readiness 503 naming Envoy's last exit", func() bool {
		c, body := get(t, base+"/healthz/ready")
		return c == 503 && strings.Contains(body, "last exit: signal: killed")
	})
	f.envoy.Send(messages.EnvoyState{Phase: messages.EnvoyDraining})
	testkit.WaitFor(t, "readiness to say Envoy drains", func() bool {
		_, body := get(t, base+"/healthz/ready")
		return strings.Contains(body, "envoy: draining")
	})

	f.envoy.Send(messages.EnvoyState{Phase: messages.EnvoyReady})
	f.health.Send(messages.Health{Service: messages.AgentService, State: messages.Stopped, Reason: "shutting down"})
	testkit.WaitFor(t, "readiness to say the agent stops", func() bool {
		_, body := get(t, base+"/healthz/ready")
		return strings.Contains(body, "agent: stopped (shutting down)")
	})
}

// Readiness stays up through an Envoy hot restart (#25): the envoy service
// publishes the serving Envoy at the top of EnvoyState and the other epoch
// in Overlap, starting then draining, with a health reason naming both.
func TestReadinessStaysUpThroughAHotRestart(t *testing.T) {
	f := newFixtureIn(Config{}, Inputs{Required: []string{messages.EnvoyService}, RequireEnvoy: true})
	base := f.serve(t)
	f.envoy.Send(messages.EnvoyState{Phase: messages.EnvoyReady, PID: 10})
	f.health.Send(messages.Health{Service: messages.EnvoyService, State: messages.Ready, Reason: "hot restart: epoch 0 (pid 10) serving, epoch 1 (pid 11) starting"})
	testkit.WaitFor(t, "ready", func() bool { c, _ := get(t, base+"/healthz/ready"); return c == 200 })
	for _, st := range []messages.EnvoyState{
		{Phase: messages.EnvoyReady, PID: 10, Overlap: messages.EnvoyProcess{Phase: messages.EnvoyRunning, PID: 11, RestartEpoch: 1}},
		{Phase: messages.EnvoyReady, PID: 11, RestartEpoch: 1, Overlap: messages.EnvoyProcess{Phase: messages.EnvoyDraining, PID: 10}},
		{Phase: messages.EnvoyReady, PID: 11, RestartEpoch: 1},
	} {
		f.envoy.Send(st) // a Cell: the next request reads it
		if code, body := get(t, base+"/healthz/ready"); code != 200 {
			t.Fatalf("during a hot restart (%+v): %d %q, want ready", st, code, body)
		}
	}
}

// The metrics endpoint serves valid Prometheus text, as promtool sees it.
func TestMetricsPassPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	f := newFixture(Config{})
	f.reg.MustRegister(collectors.NewGoCollector())
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_service_restarts_total", Help: "Restarts."}, []string{"service"})
	c.WithLabelValues("dns").Add(3)
	f.reg.MustRegister(c)
	base := f.serve(t)
	code, body := get(t, base+"/stats/prometheus")
	if code != 200 || !strings.Contains(body, `meshagent_service_restarts_total{service="dns"} 3`) {
		t.Fatalf("/stats/prometheus = %d\n%s", code, body)
	}
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = strings.NewReader(body)
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// Endpoints that stop or break the agent refuse other hosts and non-POSTs.
func TestDangerousEndpointsAreLoopbackOnly(t *testing.T) {
	f := newFixture(Config{Chaos: true, Profiling: true})
	h := f.svc.routes()
	for _, path := range []string{"/quitquitquit", "/drain", "/debug/chaos/kill?service=x", "/debug/pprof/"} {
		if rec := request(h, http.MethodPost, path, "192.0.2.10:40000", nil); rec.Code != http.StatusForbidden {
			t.Errorf("POST %s from 192.0.2.10 = %d, want 403", path, rec.Code)
		}
	}
	if got := f.stop.Take(); len(got) != 0 {
		t.Fatalf("a refused quit still sent %v", got)
	}
	if rec := request(h, http.MethodGet, "/quitquitquit", "127.0.0.1:40000", nil); rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /quitquitquit = %d, want 405", rec.Code)
	}
	rec := request(h, http.MethodPost, "/drain", "[::1]:40000", nil)
	if got := f.drain.Take(); rec.Code != 200 || len(got) != 1 || got[0].Exit {
		t.Fatalf("POST /drain = %d, drains %+v; want one Drain without exit", rec.Code, got)
	}
}

func TestProfilingAndChaosAreOptIn(t *testing.T) {
	f := newFixture(Config{})
	h := f.svc.routes()
	for _, path := range []string{"/debug/pprof/", "/debug/chaos/kill?service=x"} {
		rec := postFromLoopback(h, path)
		if rec.Code != http.StatusNotFound {
			t.Errorf("%s without opting in = %d, want 404", path, rec.Code)
		}
	}
}

func TestListenFailureIsAnError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f := newFixture(Config{Addr: ln.Addr().String()})
	err = f.svc.Serve(context.Background())
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("Serve on a busy port = %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{Addr: "nonsense"}).Validate(); err == nil {
		t.Fatal("bad address accepted")
	}
	if err := (Config{Addr: ":15020"}).Validate(); err != nil {
		t.Fatal(err)
	}
}

// A chaos kill names a service that is up; one that is down (in backoff)
// is refused rather than silently dropped.
func TestChaosKillNeedsARunningService(t *testing.T) {
	f := newFixture(Config{Chaos: true})
	f.tree.Send(messages.TreeState{Services: []messages.ServiceInfo{
		{Name: "dns", State: messages.Failed, StateName: "failed"},
		{Name: "sds", State: messages.Starting, StateName: "starting"},
	}})
	h := f.svc.routes()
	for name, want := range map[string]int{"dns": http.StatusConflict, "sds": http.StatusOK, "nope": http.StatusNotFound} {
		rec := postFromLoopback(h, "/debug/chaos/kill?service="+name)
		if rec.Code != want {
			t.Errorf("kill %s = %d %q, want %d", name, rec.Code, rec.Body.String(), want)
		}
	}
	if got := f.chaos.Take(); len(got) != 1 || got[0].Service != "sds" {
		t.Fatalf("chaos commands sent: %v, want only sds", got)
	}
}

// for=DUR holds the killed service down; a bad or unbounded duration is
// refused naming the value, and nothing is killed.
func TestChaosKillForADuration(t *testing.T) {
	f := newFixture(Config{Chaos: true})
	f.tree.Send(messages.TreeState{Services: []messages.ServiceInfo{{Name: "controlplane", State: messages.Ready, StateName: "ready"}}})
	h := f.svc.routes()
	for query, want := range map[string]int{
		"for=5x": http.StatusBadRequest, "for=-1s": http.StatusBadRequest, "for=0s": http.StatusBadRequest,
		"for=2m": http.StatusBadRequest, "for=1500ms": http.StatusOK,
	} {
		rec := postFromLoopback(h, "/debug/chaos/kill?service=controlplane&"+query)
		if rec.Code != want {
			t.Errorf("kill ?%s = %d %q, want %d", query, rec.Code, rec.Body.String(), want)
		}
		if value := strings.TrimPrefix(query, "for="); want == http.StatusBadRequest && !strings.Contains(rec.Body.String(), value) {
			t.Errorf("kill ?%s: %q does not name the value", query, rec.Body.String())
		}
	}
	if got := f.chaos.Take(); len(got) != 1 || got[0] != (messages.Chaos{Service: "controlplane", For: 1500 * time.Millisecond}) {
		t.Fatalf("chaos commands sent: %v, want one for controlplane held 1.5s", got)
	}
}

// postFromLoopback is POST path to h from a loopback caller.
func postFromLoopback(h http.Handler, path string) *httptest.ResponseRecorder {
	return request(h, http.MethodPost, path, "127.0.0.1:1", nil)
}

// New checks the config, once (issue 26): Serve never does again.
func TestNewRefusesABadConfig(t *testing.T) {
	// And the agent's registry, which only the tree hands it (issue 34).
	for _, tc := range []struct {
		cfg  Config
		in   Inputs
		want string
	}{
		{Config{Addr: "no-port"}, Inputs{Metrics: prometheus.NewRegistry()}, `"no-port"`},
		{Config{Addr: "127.0.0.1:0"}, Inputs{}, "Inputs.Metrics"},
	} {
		_, err := New(tc.cfg, tc.in, Outputs{}, messages.NewRuntime(Name, nil, nil, nil, nil))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
}
