package main

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// Envoy's listeners listen once its workers start, when /ready turns LIVE:
// before that a connection to a bootstrap listener (Istio's 15021, 15090)
// or a capture listener is refused; the admin answers from the start
// (#36).
func TestListenersListenOnceTheWorkersStart(t *testing.T) {
	t.Parallel()
	dial := func(port int) error {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
		}
		return err
	}

	t.Run("never ready", func(t *testing.T) {
		t.Parallel()
		f := newHRFixture(t)
		f.start(t, 0, []string{"FAKE_ENVOY_NEVER_READY=1"})
		f.waitReady(t, "the admin's /ready", 503)
		for name, port := range map[string]int{"the stats listener": f.http, "the capture listener": f.capture} {
			if err := dial(port); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s before the workers start: %v, want connection refused", name, err)
			}
		}
	})

	// A listener whose port another socket took between its bind and the
	// workers' start is removed, as Envoy removes it: logged, counted,
	// the others serve, /ready says LIVE, and listener_manager.
	// workers_started stays 0, which Istio's readiness waits for.
	t.Run("a port taken before the workers start", func(t *testing.T) {
		t.Parallel()
		f := newHRFixture(t)
		p := f.start(t, 0, []string{"FAKE_ENVOY_READY_AFTER=2s"})
		f.waitReady(t, "the admin's /ready", 503)
		// The stats listener's socket is bound and not listening, so a
		// socket with SO_REUSEADDR (Go sets it) may bind the port too and
		// listen first.
		taker, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", f.http))
		if err != nil {
			t.Fatalf("taking the stats listener's port before the workers start: %v", err)
		}
		defer taker.Close()
		f.waitReady(t, "/ready LIVE", 200)
		_, stats := testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d/stats", f.admin))
		testkit.Contains(t, "stats", stats, "listener_manager.workers_started: 0", "listener_manager.listener_create_failure: 1")
		// Waited for: the stand-in logs it before /ready turns LIVE, but
		// its stderr reaches p.log through exec's copying goroutine, which
		// may not have run yet (read once, it was missed with that copy
		// 50 ms late).
		p.log.WaitLine(t, "final pre-worker listener init for listener 'stats' failed: cannot listen() errno=98")
		_, listeners := testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d/listeners", f.admin))
		_, dump := testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d/config_dump?resource=static_listeners", f.admin))
		if strings.Contains(listeners, "stats::") || strings.Contains(dump, `"name": "stats"`) {
			t.Errorf("the removed listener is still listed:\n%s\n%s", listeners, dump)
		}
		if !strings.Contains(listeners, "virtualOutbound::") {
			t.Errorf("/listeners lacks the listener that listens:\n%s", listeners)
		}
		testkit.WaitFor(t, "the capture listener accepting", func() bool { return dial(f.capture) == nil })
		if err := dial(f.http); err != nil {
			t.Errorf("the stats listener's port: %v, want the taker's socket", err)
		}
		taker.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
		if c, err := taker.Accept(); err != nil {
			t.Errorf("the connection to the stats listener's port did not reach the socket that took it: %v", err)
		} else {
			c.Close()
		}
	})

	// Two Envoys of one user on one host both listen on a port they bound
	// before either listened: Envoy binds with SO_REUSEPORT on Linux
	// (enable_reuse_port defaults to true). Without it, the second one's
	// workers never started, which made parallel e2e tests that share
	// Istio's 15001 flaky.
	t.Run("two on one port", func(t *testing.T) {
		t.Parallel()
		first, second := newHRFixture(t), newHRFixture(t)
		second.capture = first.capture
		testkit.WriteFile(t, second.boot, []byte(fmt.Sprintf(hrBootstrap, second.admin, second.http, second.capture, second.admin)))
		for _, f := range []*hrFixture{first, second} {
			f.start(t, 0, []string{"FAKE_ENVOY_READY_AFTER=2s"})
		}
		for i, f := range []*hrFixture{first, second} {
			f.waitReady(t, fmt.Sprintf("stand-in %d's /ready LIVE", i+1), 200)
			_, stats := testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d/stats", f.admin))
			testkit.Contains(t, fmt.Sprintf("stand-in %d's stats", i+1), stats, "listener_manager.workers_started: 1")
		}
		testkit.WaitFor(t, "the shared capture port accepting", func() bool { return dial(first.capture) == nil })
	})

	t.Run("live", func(t *testing.T) {
		t.Parallel()
		f := newHRFixture(t)
		f.start(t, 0, nil)
		f.serverInfo(t, 0)
		testkit.WaitFor(t, "the stats and capture listeners accepting", func() bool {
			return dial(f.http) == nil && dial(f.capture) == nil
		})
		if code, _ := testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d/stats/prometheus", f.http)); code != 200 {
			t.Errorf("the stats listener once live: %d, want 200", code)
		}
	})
}
