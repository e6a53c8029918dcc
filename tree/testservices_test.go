package tree

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/status"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// readyService reports Ready and runs until stopped. Before reporting
// Ready on a run, it waits for gate (if set) so tests can hold it in
// Starting.
type readyService struct {
	name   string
	health messages.Sink[messages.Health]
	runs   atomic.Int32
	gate   chan struct{}
	// panicAfter makes the first run panic after this long.
	panicAfter time.Duration
}

func (s *readyService) String() string { return s.name }

func (s *readyService) Serve(ctx context.Context) error {
	run := s.runs.Add(1)
	if run > 1 && s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.health.Send(messages.Health{Service: s.name, State: messages.Ready, Time: time.Now()})
	if run == 1 && s.panicAfter > 0 {
		select {
		case <-time.After(s.panicAfter):
			panic("boom from " + s.name)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

// failingService fails every run at once.
type failingService struct {
	name string
	runs atomic.Int32
}

func (s *failingService) String() string { return s.name }
func (s *failingService) Serve(context.Context) error {
	n := s.runs.Add(1)
	return fmt.Errorf("run %d: %w", n, errFake)
}

var errFake = errors.New("fake failure")

// fastPolicy restarts almost at once, so tests do not wait on backoff.
func fastPolicy() *Policy {
	return &Policy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, Multiplier: 2, HealthyAfter: time.Hour}
}

// harness is a tree with a status server on a free loopback port.
type harness struct {
	t     *testing.T
	ch    *Channels
	reg   *prometheus.Registry
	agent *Agent
	base  string
	done  chan error
	stop  context.CancelFunc
}

func newHarnessWith(t *testing.T, ch *Channels, nodes []Node, opts Options, required []string) *harness {
	t.Helper()
	h := &harness{t: t, ch: ch, reg: prometheus.NewRegistry()}
	addr := freeAddr(t)
	h.base = "http://" + addr
	st, err := status.New(status.Config{Addr: addr, Chaos: true},
		status.Inputs{Health: h.ch.Health, Envoy: h.ch.Envoy, Tree: h.ch.Tree, Required: required, Metrics: h.reg},
		status.Outputs{Readiness: h.ch.Readiness, Drain: h.ch.Drain, Shutdown: h.ch.Shutdown, Chaos: h.ch.Chaos},
		messages.NewRuntime(status.Name, h.ch.Health, nil, nil, testkit.TestLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	nodes = append(nodes, Node{Service: st})
	if opts.DefaultPolicy == nil {
		opts.DefaultPolicy = fastPolicy()
	}
	a, err := New(h.ch, nodes, h.reg, testkit.TestLogger(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	h.agent = a
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(30 * time.Second):
			t.Error("agent did not stop")
		}
	})
	return h
}

func (h *harness) get(path string) (int, string) {
	return testkit.Fetch(http.MethodGet, h.base+path)
}

func (h *harness) post(path string) (int, string) {
	h.t.Helper()
	return testkit.MustFetch(h.t, http.MethodPost, h.base+path)
}

// waitRun waits for the agent's Run to return (what names the reason it
// should) and returns its error, leaving it for the harness's cleanup.
func (h *harness) waitRun(what string) error {
	h.t.Helper()
	select {
	case err := <-h.done:
		h.done <- err // for the cleanup
		return err
	case <-time.After(testkit.Timeout):
		h.t.Fatalf("timed out waiting for %s", what)
		return nil
	}
}

func (h *harness) waitStatus(path string, code int) string {
	h.t.Helper()
	var body string
	testkit.WaitFor(h.t, fmt.Sprintf("GET %s = %d", path, code), func() bool {
		var got int
		got, body = h.get(path)
		return got == code
	})
	return body
}

// waitAllRunning waits until /debug/tree shows every service ready and
// every supervisor running: a kill then finds its target up.
func (h *harness) waitAllRunning() {
	h.t.Helper()
	testkit.WaitFor(h.t, "every service ready", func() bool {
		_, body := h.get("/debug/tree?format=json")
		var tree struct {
			Services []messages.ServiceInfo `json:"services"`
		}
		if json.Unmarshal([]byte(body), &tree) != nil || len(tree.Services) == 0 {
			return false
		}
		for _, s := range tree.Services {
			if s.StateName != "ready" && s.StateName != "running" {
				return false
			}
		}
		return true
	})
}

func (h *harness) counter(name, service string) float64 {
	h.t.Helper()
	return testkit.MetricValue(h.t, h.reg, name, "service", service)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
