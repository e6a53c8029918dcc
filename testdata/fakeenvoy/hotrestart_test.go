package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
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
	testkit.CleanupEnvoySharedMemory(t, id)
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

// killedEpoch0 runs epoch 0 until LIVE, then SIGKILLs it: a parent gone,
// its shared memory left behind.
func (f *hrFixture) killedEpoch0(t *testing.T) {
	t.Helper()
	p := f.start(t, 0, nil)
	f.serverInfo(t, 0)
	f.initialized(t)
	p.cmd.Process.Kill()
	p.wait(t, "epoch 0 after SIGKILL")
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

func (p *epochProc) running() bool { return !testkit.Closed(p.done) }

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

// waitReady waits until the admin's /ready answers code (503 before the
// workers start, 200 once LIVE).
func (f *hrFixture) waitReady(t *testing.T, what string, code int) {
	t.Helper()
	testkit.WaitFor(t, what, func() bool {
		got, _ := testkit.Fetch("GET", fmt.Sprintf("http://127.0.0.1:%d/ready", f.admin))
		return got == code
	})
}

// initialized waits for the shared memory's INITIALIZING flag to clear.
// As in Envoy, that comes just after the server turns LIVE
// (drainParentListeners, once the workers run): a test that kills an
// epoch and starts the next must wait for it too, or the next epoch finds
// its parent "still initializing".
func (f *hrFixture) initialized(t *testing.T) {
	t.Helper()
	testkit.WaitFor(t, "the INITIALIZING flag cleared", func() bool {
		b, err := os.ReadFile(shmPath(f.base * 10))
		return err == nil && len(b) >= shmSize && binary.NativeEndian.Uint64(b[shmFlagsOffset:])&shmFlagInitializing == 0
	})
}

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
	f.initialized(t)
	if info["hot_restart_version"] != hotRestartVersion {
		t.Errorf("epoch 0 hot_restart_version = %v, want %s", info["hot_restart_version"], hotRestartVersion)
	}

	d := testkit.StartDialer(fmt.Sprintf("127.0.0.1:%d", f.http), fmt.Sprintf("127.0.0.1:%d", f.capture))
	defer d.Stop()
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
		f.initialized(t)
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
	d.Stop()
	if accepted, refused, other := d.Counts(); refused != 0 || accepted == 0 {
		t.Fatalf("across 3 hot restarts: %d connections accepted, %d refused, %d other errors (last: %v); want none refused",
			accepted, refused, other, d.LastError())
	} else {
		t.Logf("across 3 hot restarts: %d connections accepted, none refused (%d other dial errors)", accepted, other)
	}
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

// Istio's capture listeners come over LDS: a child takes their sockets from
// its parent too (when LDS adds them, before its init completes and it tells
// the parent to drain), so a client is never refused (#25).
func TestHotRestartTakesLDSListenersFromTheParent(t *testing.T) {
	t.Parallel()
	f := &hrFixture{bin: standInBinary(t), base: uniqueBaseID(t), admin: testkit.FreePort(t), capture: testkit.FreePort(t)}
	dir := testkit.ShortTempDir(t, "fe-hr")
	x, err := xdsserver.Start(xdsserver.Options{Addr: "unix:" + filepath.Join(dir, "XDS")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	capture := &listenerv3.Listener{Name: "virtualOutbound", UseOriginalDst: wrapperspb.Bool(true),
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(f.capture)}}}}}
	if err := x.SetResources("v1", map[resource.Type][]types.Resource{
		resource.ClusterType:  {&clusterv3.Cluster{Name: "passthrough", ConnectTimeout: durationpb.New(time.Second)}},
		resource.ListenerType: {capture},
	}); err != nil {
		t.Fatal(err)
	}
	f.boot = filepath.Join(dir, "bootstrap.json")
	testkit.WriteFile(t, f.boot, []byte(adsBootstrap(f.admin, "", filepath.Join(dir, "XDS"))))

	p0 := f.start(t, 0, nil)
	f.serverInfo(t, 0)
	f.initialized(t)
	d := testkit.StartDialer(fmt.Sprintf("127.0.0.1:%d", f.capture))
	defer d.Stop()
	p1 := f.start(t, 1, nil)
	if st := p0.wait(t, "epoch 0 after its child took over"); !st.Success() {
		t.Fatalf("epoch 0: %v\n%s", st, p0.log)
	}
	p1.log.WaitLine(t, fmt.Sprintf("obtained socket for address tcp://127.0.0.1:%d from parent", f.capture))
	f.serverInfo(t, 1)
	d.Stop()
	if accepted, refused, other := d.Counts(); refused != 0 || accepted == 0 {
		t.Fatalf("across a hot restart: %d connections accepted, %d refused, %d other errors (last: %v); want none refused",
			accepted, refused, other, d.LastError())
	}
}

// --socket-path without '@' is a path on disk, as in Envoy: the sockets are
// files with --socket-mode, and hot restart works through them (#25).
func TestHotRestartSocketPathOnDisk(t *testing.T) {
	t.Parallel()
	f := newHRFixture(t)
	path := filepath.Join(testkit.ShortTempDir(t, "fe-hr"), "hr")
	flags := []string{"--socket-path", path, "--socket-mode", "640"}
	p0 := f.start(t, 0, nil, flags...)
	f.serverInfo(t, 0)
	f.initialized(t)
	for _, role := range []string{"child", "parent"} {
		name := fmt.Sprintf("%s_%s_%d", path, role, f.base*10)
		if st, err := os.Stat(name); err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o640 {
			t.Fatalf("%s: %v, %v; want a socket with mode 0640", name, st, err)
		}
	}
	p1 := f.start(t, 1, nil, flags...)
	if st := p0.wait(t, "epoch 0 after its child took over"); !st.Success() {
		t.Fatalf("epoch 0: %v\n%s", st, p0.log)
	}
	p1.log.WaitLine(t, fmt.Sprintf("obtained socket for address tcp://127.0.0.1:%d from parent", f.http))
	f.serverInfo(t, 1)
}

// As Envoy: a process that gets a child terminates its own parent if that
// one still runs (so a third epoch ends the first), and SIGTERM to the
// newest epoch ends its parent too, both exiting 0 (#25).
func TestHotRestartOlderEpochsEnd(t *testing.T) {
	t.Parallel()
	f := newHRFixture(t)
	long := []string{"--parent-shutdown-time-s", "600"}
	p0 := f.start(t, 0, nil, long...)
	f.serverInfo(t, 0)
	f.initialized(t)
	p1 := f.start(t, 1, nil, long...)
	p0.log.WaitLine(t, "draining listeners")
	f.serverInfo(t, 1)
	f.initialized(t)

	p2 := f.start(t, 2, nil, long...)
	if st := p0.wait(t, "epoch 0 once epoch 2 started"); !st.Success() {
		t.Fatalf("epoch 0: %v, want exit 0\n%s", st, p0.log)
	}
	p1.log.WaitLine(t, "shutting down admin due to child startup")
	p1.log.WaitLine(t, "terminating parent process")
	p1.log.WaitLine(t, "draining listeners")
	f.serverInfo(t, 2)
	if !p1.running() {
		t.Fatalf("epoch 1 ended before its parent shutdown time\n%s", p1.log)
	}

	p2.cmd.Process.Signal(syscall.SIGTERM)
	for n, p := range []*epochProc{p1, p2} {
		if st := p.wait(t, fmt.Sprintf("epoch %d after SIGTERM to epoch 2", n+1)); !st.Success() {
			t.Fatalf("epoch %d: %v, want exit 0\n%s", n+1, st, p.log)
		}
	}
	p1.log.WaitLine(t, "shutting down due to child request")
}
