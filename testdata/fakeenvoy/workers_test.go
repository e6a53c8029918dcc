package main

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

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
		testkit.WaitFor(t, "the admin's /ready", func() bool {
			code, _ := testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d/ready", f.admin))
			return code == 503
		})
		for name, port := range map[string]int{"the stats listener": f.http, "the capture listener": f.capture} {
			if err := dial(port); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s before the workers start: %v, want connection refused", name, err)
			}
		}
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
