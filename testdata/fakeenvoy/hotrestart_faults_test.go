package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// The ways a new epoch fails to start, each as Envoy fails (#25).
func TestHotRestartFailures(t *testing.T) {
	t.Parallel()
	fastRetry := []string{"FAKE_ENVOY_HOT_RESTART_RETRY_DELAY=1ms"}

	// A parent that is gone refuses every datagram: the child retries
	// (Envoy: 10 times a second apart) and aborts.
	t.Run("parent gone", func(t *testing.T) {
		t.Parallel()
		f := newHRFixture(t)
		f.killedEpoch0(t)
		p1 := f.start(t, 1, fastRetry)
		wantAbort(t, p1.wait(t, "epoch 1 without a parent"), p1)
		testkit.Contains(t, "epoch 1's log", p1.log.String(), "hot restart sendmsg() connection refused, retrying",
			"hot restart sendmsg() failed: returned -1, errno 111")
	})

	// --skip-hot-restart-on-no-parent: the child starts as an epoch 0 would,
	// keeping its epoch number, binding its listeners afresh.
	t.Run("parent gone, skip", func(t *testing.T) {
		t.Parallel()
		f := newHRFixture(t)
		f.killedEpoch0(t)
		p1 := f.start(t, 1, fastRetry, "--skip-hot-restart-on-no-parent")
		f.serverInfo(t, 1)
		p1.log.WaitLine(t, "hot restart sendmsg() connection refused, falling back to regular restart")
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", f.http)); err != nil {
			t.Fatalf("epoch 1's listener: %v", err)
		} else {
			c.Close()
		}
	})

	// Another process holds this epoch's sockets (the same epoch, or epoch
	// +3 with Envoy's modulo): the start fails, the running one serves on.
	t.Run("collision", func(t *testing.T) {
		t.Parallel()
		f := newHRFixture(t)
		f.start(t, 0, nil)
		f.serverInfo(t, 0)
		for _, epoch := range []int{0, 3} {
			p := f.start(t, epoch, fastRetry)
			if st := p.wait(t, fmt.Sprintf("a second epoch %d", epoch)); st.ExitCode() != 1 {
				t.Fatalf("epoch %d beside epoch 0: %v, want exit 1\n%s", epoch, st, p.log)
			}
			testkit.Contains(t, "its log", p.log.String(),
				fmt.Sprintf("unable to bind domain socket with base_id=%d, id=0, errno=98 (see --base-id option)", f.base*10))
		}
		f.serverInfo(t, 0)
	})

	// The parent has not finished initialising: the child fails before it
	// asks the parent anything (the parent keeps its admin).
	t.Run("parent initializing", func(t *testing.T) {
		t.Parallel()
		f := newHRFixture(t)
		p0 := f.start(t, 0, []string{"FAKE_ENVOY_NEVER_READY=1"})
		f.waitReady(t, "epoch 0's admin", 503)
		p1 := f.start(t, 1, fastRetry)
		if st := p1.wait(t, "epoch 1 beside an initialising epoch 0"); st.ExitCode() != 1 {
			t.Fatalf("epoch 1: %v, want exit 1\n%s", st, p1.log)
		}
		testkit.Contains(t, "epoch 1's log", p1.log.String(), "previous envoy process is still initializing")
		if code, body := testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d/ready", f.admin)); code != 503 || !p0.running() {
			t.Fatalf("epoch 0 after the failed child: /ready %d %q, running %v; want its admin kept", code, body, p0.running())
		}
	})

	// A child that dies during its start leaves Envoy's INITIALIZING flag
	// set: the parent serves on, and every later epoch of this base id is
	// refused as if the dead child were still initialising. Only a new
	// epoch 0 (a cold start) clears it.
	t.Run("child crashes at start", func(t *testing.T) {
		t.Parallel()
		f := newHRFixture(t)
		p0 := f.start(t, 0, nil)
		f.serverInfo(t, 0)
		p1 := f.start(t, 1, append([]string{"FAKE_ENVOY_EXIT_AT_START=1", "FAKE_ENVOY_EXIT_CODE=3"}, fastRetry...))
		if st := p1.wait(t, "the crashing epoch 1"); st.ExitCode() != 3 {
			t.Fatalf("epoch 1: %v, want exit 3\n%s", st, p1.log)
		}
		f.serverInfo(t, 0)
		again := f.start(t, 1, fastRetry)
		if st := again.wait(t, "epoch 1 again"); st.ExitCode() != 1 {
			t.Fatalf("epoch 1 again: %v, want exit 1\n%s", st, again.log)
		}
		testkit.Contains(t, "the second epoch 1's log", again.log.String(), "previous envoy process is still initializing")
		p0.cmd.Process.Signal(syscall.SIGTERM)
		if st := p0.wait(t, "epoch 0 after SIGTERM"); !st.Success() {
			t.Fatalf("epoch 0: %v\n%s", st, p0.log)
		}
		f.start(t, 0, nil)
		f.serverInfo(t, 0)
	})

	// A parent SIGKILLed during the overlap: the child aborts when it next
	// sends, here its next stats flush's request (5s), long before it
	// would tell the parent to terminate.
	t.Run("parent killed during the overlap", func(t *testing.T) {
		t.Parallel()
		f := newHRFixture(t)
		p0 := f.start(t, 0, nil)
		f.serverInfo(t, 0)
		p1 := f.start(t, 1, fastRetry, "--parent-shutdown-time-s", "600")
		p0.log.WaitLine(t, "draining listeners")
		p0.cmd.Process.Kill()
		wantAbort(t, p1.wait(t, "epoch 1 after its parent was killed"), p1)
		testkit.Contains(t, "epoch 1's log", p1.log.String(), "hot restart sendmsg() failed: returned -1, errno 111")
	})

	// --mode validate reads the bootstrap and binds nothing: it succeeds
	// beside a running epoch 0 holding the same base id and ports.
	t.Run("validate", func(t *testing.T) {
		t.Parallel()
		f := newHRFixture(t)
		f.start(t, 0, nil)
		f.serverInfo(t, 0)
		out, err := exec.Command(f.bin, "-c", f.boot, "--base-id", fmt.Sprint(f.base), "--mode", "validate").Output()
		if err != nil || string(out) != fmt.Sprintf("configuration '%s' OK\n", f.boot) {
			t.Fatalf("validate: %v, stdout %q", err, out)
		}
		bad := filepath.Join(t.TempDir(), "bad.json")
		testkit.WriteFile(t, bad, []byte(`{"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 99999}}}}`))
		out, err = exec.Command(f.bin, "-c", bad, "--base-id", fmt.Sprint(f.base), "--mode", "validate").CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "error initializing configuration '"+bad+"'") {
			t.Fatalf("validate of a bad bootstrap: %v\n%s", err, out)
		}
	})

	// --disable-hot-restart: no socket, no parent asked, epochs ignored.
	t.Run("disabled", func(t *testing.T) {
		t.Parallel()
		f := newHRFixture(t)
		name := fmt.Sprintf("@envoy_domain_socket_parent_%d@", f.base*10)
		p := f.start(t, 0, nil)
		f.serverInfo(t, 0)
		if !boundUnixSocket(t, name) {
			t.Fatalf("with hot restart, %s is not bound", name)
		}
		p.cmd.Process.Kill()
		p.wait(t, "epoch 0 after SIGKILL")
		f.start(t, 1, nil, "--disable-hot-restart")
		if info := f.serverInfo(t, 1); info["hot_restart_version"] != "disabled" {
			t.Errorf("hot_restart_version = %v, want disabled", info["hot_restart_version"])
		}
		if boundUnixSocket(t, fmt.Sprintf("_%d@", f.base*10+1)) {
			t.Fatalf("with --disable-hot-restart, a hot restart socket is bound")
		}
		for flag, want := range map[string]string{"--hot-restart-version": hotRestartVersion, "--disable-hot-restart": "disabled"} {
			out, err := exec.Command(f.bin, "-c", f.boot, "--hot-restart-version", flag).CombinedOutput()
			if err != nil || !strings.HasSuffix(string(out), want) {
				t.Errorf("--hot-restart-version %s: %v, %q; want %s", flag, err, out, want)
			}
		}
	})
}

func wantAbort(t *testing.T, st *os.ProcessState, p *epochProc) {
	t.Helper()
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGABRT {
		t.Fatalf("%v, want killed by SIGABRT (Envoy's RELEASE_ASSERT)\n%s", st, p.log)
	}
}

// boundUnixSocket: a unix socket whose name (as /proc/net/unix shows it:
// '@' for the abstract namespace's NUL and the padding) contains name.
// The thread's own view: /proc/net is the main thread's, which another
// test of this package may have moved into a network namespace.
func boundUnixSocket(t *testing.T, name string) bool {
	raw, err := os.ReadFile("/proc/thread-self/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(raw), name)
}
