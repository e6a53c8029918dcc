package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// The stand-in, built once for every hot restart test.
var standIn struct {
	once      sync.Once
	dir, path string
	err       error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if standIn.dir != "" {
		os.RemoveAll(standIn.dir)
	}
	os.Exit(code)
}

func standInBinary(t *testing.T) string {
	t.Helper()
	standIn.once.Do(func() {
		if standIn.dir, standIn.err = os.MkdirTemp("", "fakeenvoy-hr"); standIn.err != nil {
			return
		}
		standIn.path = filepath.Join(standIn.dir, "fakeenvoy")
		if out, err := exec.Command("go", "build", "-o", standIn.path, ".").CombinedOutput(); err != nil {
			standIn.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if standIn.err != nil {
		t.Fatal(standIn.err)
	}
	return standIn.path
}

var nextBaseID atomic.Int32

// uniqueBaseID is a base id no other test (of this process or another
// `go test` running now) uses: sockets and shared memory are per base id.
// Its shared memory is removed at the end (Envoy leaves it behind).
func uniqueBaseID(t *testing.T) int {
	id := (os.Getpid()%20000)*1000 + 100 + int(nextBaseID.Add(1))
	t.Cleanup(func() { os.Remove(shmPath(id * 10)) })
	return id
}

// hrFixture is a bootstrap on free loopback ports: the admin, an HTTP
// listener routed to the admin (as Istio's 15090) and a capture listener
// (as 15001).
type hrFixture struct {
	bin, boot            string
	base                 int
	admin, http, capture int
}

func newHRFixture(t *testing.T) *hrFixture {
	f := &hrFixture{bin: standInBinary(t), base: uniqueBaseID(t),
		admin: testkit.FreePort(t), http: testkit.FreePort(t), capture: testkit.FreePort(t)}
	f.boot = filepath.Join(t.TempDir(), "bootstrap.json")
	testkit.WriteFile(t, f.boot, []byte(fmt.Sprintf(hrBootstrap, f.admin, f.http, f.capture, f.admin)))
	return f
}

const hrBootstrap = `{
  "node": {"id": "sidecar~127.0.0.1~app.default~default.svc.cluster.local", "cluster": "app.default"},
  "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": %d}}},
  "static_resources": {
    "listeners": [
      {"name": "stats", "address": {"socket_address": {"address": "127.0.0.1", "port_value": %d}},
       "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
         "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": "stats", "route_config": {"virtual_hosts": [{"name": "b", "domains": ["*"],
             "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "prometheus_stats"}}]}]},
           "http_filters": [{"name": "envoy.filters.http.router",
             "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]},
      {"name": "virtualOutbound", "address": {"socket_address": {"address": "127.0.0.1", "port_value": %d}}, "use_original_dst": true}
    ],
    "clusters": [{"name": "prometheus_stats", "type": "STATIC", "connect_timeout": "1s",
      "load_assignment": {"cluster_name": "prometheus_stats", "endpoints": [{"lb_endpoints": [{"endpoint":
        {"address": {"socket_address": {"address": "127.0.0.1", "port_value": %d}}}}]}]}}]
  }
}`

// epochProc is one running stand-in.
type epochProc struct {
	cmd  *exec.Cmd
	log  *testkit.LogBuffer
	done chan struct{}
}

// start runs epoch n with the fixture's base id (and extra flags and
// environment), a parent shutdown time of 1s, until the end of the test.
func (f *hrFixture) start(t *testing.T, n int, env []string, extra ...string) *epochProc {
	t.Helper()
	args := append([]string{"-c", f.boot, "--base-id", fmt.Sprint(f.base), "--restart-epoch", fmt.Sprint(n),
		"--drain-time-s", "1", "--parent-shutdown-time-s", "1"}, extra...)
	p := &epochProc{cmd: exec.Command(f.bin, args...), log: testkit.NewLogBuffer(t), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.Env = append(os.Environ(), env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.cmd.Process.Kill(); <-p.done })
	return p
}

// wait returns how the process ended; the test fails if it does not.
func (p *epochProc) wait(t *testing.T, what string) *os.ProcessState {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState
	case <-time.After(testkit.Timeout):
		t.Fatalf("%s: still running after %v\n%s", what, testkit.Timeout, p.log)
		return nil
	}
}

func (p *epochProc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// serverInfo is the admin's /server_info once it answers with epoch n.
func (f *hrFixture) serverInfo(t *testing.T, n int) map[string]any {
	t.Helper()
	var info map[string]any
	testkit.WaitFor(t, fmt.Sprintf("epoch %d LIVE on the admin port", n), func() bool {
		code, body := testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d/server_info", f.admin))
		info = nil
		if code != 200 || json.Unmarshal([]byte(body), &info) != nil {
			return false
		}
		opts, _ := info["command_line_options"].(map[string]any)
		return info["state"] == "LIVE" && opts["restart_epoch"] == float64(n)
	})
	return info
}

// dialer opens connections to addrs without pause until stopped (or a
// bounded count), closing each at once, and counts the refused ones.
type dialer struct {
	halted            sync.Once
	stop              chan struct{}
	done              chan struct{}
	ok, refused, othr atomic.Int64
	lastErr           atomic.Value
}

func startDialer(addrs ...string) *dialer {
	d := &dialer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		for i := 0; i < 2_000_000; i++ {
			select {
			case <-d.stop:
				return
			default:
			}
			c, err := net.DialTimeout("tcp", addrs[i%len(addrs)], 5*time.Second)
			switch {
			case err == nil:
				c.Close()
				d.ok.Add(1)
			case errors.Is(err, syscall.ECONNREFUSED):
				d.refused.Add(1)
				d.lastErr.Store(err.Error())
			default:
				d.othr.Add(1)
				d.lastErr.Store(err.Error())
			}
		}
	}()
	return d
}

func (d *dialer) halt() { d.halted.Do(func() { close(d.stop) }); <-d.done }

// Across three hot restarts (epoch 3 reuses epoch 0's socket names, Envoy's
// modulo 3), a client dialling without pause is never refused: each child
// takes its parent's listening sockets by SCM_RIGHTS, the parent drains
// and exits 0 after the parent shutdown time, and the admin answers for
// the newest epoch with Envoy's hot restart fields (#25).
func TestHotRestartNoConnectionRefusedAcrossEpochs(t *testing.T) {
	t.Parallel()
	f := newHRFixture(t)
	prev := f.start(t, 0, nil)
	info := f.serverInfo(t, 0)
	if info["hot_restart_version"] != hotRestartVersion {
		t.Errorf("epoch 0 hot_restart_version = %v, want %s", info["hot_restart_version"], hotRestartVersion)
	}

	d := startDialer(fmt.Sprintf("127.0.0.1:%d", f.http), fmt.Sprintf("127.0.0.1:%d", f.capture))
	defer d.halt()
	for n := 1; n <= 3; n++ {
		cur := f.start(t, n, nil)
		st := prev.wait(t, fmt.Sprintf("epoch %d after its child took over", n-1))
		if !st.Success() {
			t.Fatalf("epoch %d: %v, want exit 0\n%s", n-1, st, prev.log)
		}
		prev.log.WaitLine(t, "shutting down due to child request")
		for _, port := range []int{f.http, f.capture} {
			cur.log.WaitLine(t, fmt.Sprintf("obtained socket for address tcp://127.0.0.1:%d from parent", port))
		}
		if admin := fmt.Sprintf("tcp://127.0.0.1:%d", f.admin); strings.Contains(cur.log.String(), admin) {
			t.Errorf("epoch %d asked for the admin socket %s: Envoy's child binds its own\n%s", n, admin, cur.log)
		}
		info := f.serverInfo(t, n)
		if info["hot_restart_version"] != hotRestartVersion {
			t.Errorf("epoch %d hot_restart_version = %v", n, info["hot_restart_version"])
		}
		var all, current time.Duration
		fmt.Sscanf(info["uptime_all_epochs"].(string), "%ds", &all)
		fmt.Sscanf(info["uptime_current_epoch"].(string), "%ds", &current)
		if all < current+time.Duration(n-1) {
			// Epoch n started at least n-1 parent shutdown times (1s)
			// after epoch 0.
			t.Errorf("epoch %d: uptime_all_epochs %v, uptime_current_epoch %v: want all epochs counted", n,
				info["uptime_all_epochs"], info["uptime_current_epoch"])
		}
		prev = cur
	}
	d.halt()
	if d.refused.Load() != 0 || d.ok.Load() == 0 {
		t.Fatalf("across 3 hot restarts: %d connections accepted, %d refused, %d other errors (last: %v); want none refused",
			d.ok.Load(), d.refused.Load(), d.othr.Load(), d.lastErr.Load())
	}
	t.Logf("across 3 hot restarts: %d connections accepted, none refused", d.ok.Load())
}

// The ways a new epoch fails to start, each as Envoy fails (#25).
func TestHotRestartFailures(t *testing.T) {
	t.Parallel()
	fastRetry := []string{"FAKE_ENVOY_HOT_RESTART_RETRY_DELAY=1ms"}

	// A parent that is gone refuses every datagram: the child retries
	// (Envoy: 10 times a second apart) and aborts.
	t.Run("parent gone", func(t *testing.T) {
		t.Parallel()
		f := newHRFixture(t)
		p0 := f.start(t, 0, nil)
		f.serverInfo(t, 0)
		p0.cmd.Process.Kill()
		p0.wait(t, "epoch 0 after SIGKILL")
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
		p0 := f.start(t, 0, nil)
		f.serverInfo(t, 0)
		p0.cmd.Process.Kill()
		p0.wait(t, "epoch 0 after SIGKILL")
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
		testkit.WaitFor(t, "epoch 0's admin", func() bool {
			code, _ := testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d/ready", f.admin))
			return code == 503
		})
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

// A listener the parent does not have (the new epoch's bootstrap added it)
// is bound afresh; the others are the parent's (#25).
func TestHotRestartNewListenerBoundAfresh(t *testing.T) {
	t.Parallel()
	f := newHRFixture(t)
	f.start(t, 0, nil)
	f.serverInfo(t, 0)
	extra := testkit.FreePort(t)
	var boot map[string]any
	raw, err := os.ReadFile(f.boot)
	if err == nil {
		err = json.Unmarshal(raw, &boot)
	}
	if err != nil {
		t.Fatal(err)
	}
	ls := boot["static_resources"].(map[string]any)["listeners"].([]any)
	l := map[string]any{"name": "extra", "address": map[string]any{"socket_address": map[string]any{"address": "127.0.0.1", "port_value": extra}},
		"filter_chains": ls[0].(map[string]any)["filter_chains"]}
	boot["static_resources"].(map[string]any)["listeners"] = append(ls, l)
	if raw, err = json.Marshal(boot); err != nil {
		t.Fatal(err)
	}
	f.boot = filepath.Join(t.TempDir(), "bootstrap-extra.json")
	testkit.WriteFile(t, f.boot, raw)
	p1 := f.start(t, 1, nil)
	f.serverInfo(t, 1)
	p1.log.WaitLine(t, fmt.Sprintf("obtained socket for address tcp://127.0.0.1:%d from parent", f.http))
	if code, _ := testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d/ready", extra)); code != 200 {
		t.Fatalf("the new listener, routed to the admin's /ready: %d\n%s", code, p1.log)
	}
	if strings.Contains(p1.log.String(), fmt.Sprintf("tcp://127.0.0.1:%d from parent", extra)) {
		t.Fatalf("a socket the parent never had came from it\n%s", p1.log)
	}
}

func wantAbort(t *testing.T, st *os.ProcessState, p *epochProc) {
	t.Helper()
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGABRT {
		t.Fatalf("%v, want killed by SIGABRT (Envoy's RELEASE_ASSERT)\n%s", st, p.log)
	}
}

// boundUnixSocket: a unix socket whose name (as /proc/net/unix shows it:
// '@' for the abstract namespace's NUL and the padding) contains name.
func boundUnixSocket(t *testing.T, name string) bool {
	raw, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(raw), name)
}
