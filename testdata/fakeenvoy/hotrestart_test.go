package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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
