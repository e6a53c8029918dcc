package envoy

// Hot restart by epochs (#25), against the stand-in's hot restart
// (testdata/fakeenvoy/hotrestart.go): real processes, real sockets passed
// between them, the service's own file watch.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/envoy/bootstrap"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestHotRestartArgs(t *testing.T) {
	hr := &HotRestartConfig{BaseID: 42, ParentShutdownDuration: time.Minute}
	istio := CommandLine(istioArgs(), bootstrap.File{Path: "/etc/istio/proxy/envoy-rev.json"})
	got := hr.args(istio, 3)
	if slices.Contains(got, "--disable-hot-restart") {
		t.Fatalf("hot restart line keeps --disable-hot-restart: %q", got)
	}
	want := []string{"--restart-epoch", "3", "--base-id", "42", "--parent-shutdown-time-s", "60"}
	i := slices.Index(istio, "--disable-hot-restart")
	if !slices.Equal(got[i:i+len(want)], want) || !slices.Equal(got[:i], istio[:i]) || !slices.Equal(got[i+len(want):], istio[i+1:]) {
		t.Fatalf("hot restart line %q: want Istio's %q with %q for --disable-hot-restart", got, istio, want)
	}
}

var hotBaseIDs atomic.Int32

// hotBaseID is a base id no other test uses (sockets and shared memory are
// per base id, in this network namespace); the shared memory Envoy leaves
// behind is removed at the end.
func hotBaseID(t *testing.T) int {
	id := 30_000_000 + (os.Getpid()%20000)*100 + int(hotBaseIDs.Add(1))
	testkit.CleanupEnvoySharedMemory(t, id)
	return id
}

// hotHarness is a harness whose bootstrap the test changes through an
// input file the render reads (as the mesh config file is read), with a
// static listener a client dials.
type hotHarness struct {
	*harness
	// input is the template of the bootstrap Envoy runs (--templateFile):
	// the harness's bootstrap, with the last edit as node metadata EDIT.
	input string
	// override is the bootstrap override (ISTIO_BOOTSTRAP_OVERRIDE), which
	// Envoy applies and the agent does not check: "{}", or an admin port
	// Envoy refuses after the edit "invalid".
	override string
	base     []byte // the harness's bootstrap
	port     int    // the static listener's port
	listen   string // the static listener's address
	// env is added to the environment of the Envoys a Reload starts.
	mu  sync.Mutex
	env []string
	// reload, if set, changes the Config a Reload returns.
	reload func(*Config)
	// pids are every Envoy the test saw.
	pids map[int]bool
}

// newHotHarness builds a service with hot restart on (or off: the same
// bootstrap and listener, Istio's command line).
func newHotHarness(t *testing.T, on bool, env []string, mod func(*Config)) *hotHarness {
	t.Helper()
	dir := testkit.ShortTempDir(t, "hr")
	h := &hotHarness{input: filepath.Join(dir, "bootstrap.json"), override: filepath.Join(dir, "override.json"), pids: map[int]bool{}}
	port := testkit.FreePort(t)
	h.port, h.listen = port, fmt.Sprintf("127.0.0.1:%d", port)
	env = append(env, "FAKE_ENVOY_HOT_RESTART_RETRY_DELAY=20ms")
	h.harness = newHarness(t, env, func(cfg *Config) {
		raw, err := os.ReadFile(cfg.Bootstrap.CustomConfigFile)
		if err != nil {
			t.Fatal(err)
		}
		h.base = raw
		testkit.WriteFile(t, h.override, []byte("{}"))
		testkit.WriteFile(t, h.input, hotBootstrap(t, raw, "v0", port))
		// A template, not a custom config file: the agent renders it to
		// a bootstrap of its own, which it writes back after a refused
		// edit.
		boot := *cfg.Bootstrap
		boot.CustomConfigFile, boot.TemplateFile, boot.OverrideFile = "", h.input, h.override
		cfg.Bootstrap = &boot
		if mod != nil {
			mod(cfg)
		}
		if !on {
			return
		}
		base := *cfg
		cfg.HotRestart = &HotRestartConfig{
			BaseID: hotBaseID(t), ParentShutdownDuration: time.Second, Watch: []string{h.input, h.override}, Debounce: 50 * time.Millisecond,
			// Longer than any epoch of these tests takes to turn ready (1 s).
			TakeOverTimeout: 4 * time.Second,
			// No memory cgroup: the machine's own limit is not the test's.
			CgroupRoot: t.TempDir(),
			Reload: func() (Config, error) {
				c := base
				h.mu.Lock()
				c.Env = append(slices.Clone(base.Env), h.env...)
				if h.reload != nil {
					h.reload(&c)
				}
				h.mu.Unlock()
				return c, nil
			},
		}
	})
	t.Cleanup(h.checkNoneLeft)
	return h
}

// hotBootstrap is the harness's bootstrap base (a template without
// actions: it renders as it is) with edit as node metadata and a static
// listener on port.
func hotBootstrap(t testing.TB, base []byte, edit string, port int) []byte {
	t.Helper()
	var boot map[string]any
	if err := json.Unmarshal(base, &boot); err != nil {
		t.Fatal(err)
	}
	boot["node"].(map[string]any)["metadata"] = map[string]any{"EDIT": edit}
	boot["staticResources"].(map[string]any)["listeners"] = []any{json.RawMessage(fmt.Sprintf(probeListener, port))}
	out, err := json.Marshal(boot)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

const probeListener = `{"name": "probe", "address": {"socketAddress": {"address": "127.0.0.1", "portValue": %d}},
  "filterChains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
    "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
      "statPrefix": "probe", "routeConfig": {"virtualHosts": [{"name": "b", "domains": ["*"],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "xds-grpc"}}]}]},
      "httpFilters": [{"name": "envoy.filters.http.router",
        "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}`

// edit rewrites the bootstrap template with text as node metadata EDIT, as
// an editor or the kubelet would; "invalid" also overrides the admin port
// with one out of range, which Envoy refuses.
func (h *hotHarness) edit(text string) {
	override := "{}"
	if text == "invalid" {
		override = `{"admin":{"address":{"socketAddress":{"address":"127.0.0.1","portValue":99999}}}}`
	}
	testkit.ReplaceFile(h.t, h.override, []byte(override))
	testkit.ReplaceFile(h.t, h.input, hotBootstrap(h.t, h.base, text, h.port))
}

// setEnv sets the environment the next Reload gives its Envoy.
func (h *hotHarness) setEnv(env ...string) {
	h.mu.Lock()
	h.env = env
	h.mu.Unlock()
}

// wait waits for a state and remembers its Envoys.
func (h *hotHarness) wait(what string, ok func(messages.EnvoyState) bool) messages.EnvoyState {
	h.t.Helper()
	st := h.waitState(what, ok)
	h.seen()
	return st
}

// seen remembers every Envoy published so far.
func (h *hotHarness) seen() {
	for _, st := range h.state.All() {
		for _, pid := range []int{st.PID, st.Overlap.PID} {
			if pid != 0 {
				h.pids[pid] = true
			}
		}
	}
}

// alone: one Envoy, ready, of restart epoch n.
func alone(n int) func(messages.EnvoyState) bool {
	return func(st messages.EnvoyState) bool {
		return st.Phase == messages.EnvoyReady && st.RestartEpoch == n && st.Overlap.PID == 0
	}
}

// alive are the Envoys seen that still run.
func (h *hotHarness) alive() []int {
	h.seen()
	var pids []int
	for pid := range h.pids {
		if !pidGone(pid) && !testkit.IsZombie(pid) {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

// stillAlone fails the test unless first, epoch 0, is still the one
// Envoy (after a hot restart that did not happen).
func (h *hotHarness) stillAlone(first messages.EnvoyState, after string) {
	h.t.Helper()
	if st, _ := h.state.Get(); st.PID != first.PID || !alone(0)(st) {
		h.t.Fatalf("%s: %+v, want epoch 0 (pid %d) alone", after, st, first.PID)
	}
	h.onlyServing(first)
}

// checkNoneLeft fails the test if an Envoy it saw still runs at its end
// (after Serve returned: cleanups run last in, first out).
func (h *hotHarness) checkNoneLeft() {
	if pids := h.alive(); len(pids) > 0 {
		h.t.Errorf("envoys still running after the test: %v", pids)
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// onlyServing checks that exactly one Envoy of those seen runs: st's.
func (h *hotHarness) onlyServing(st messages.EnvoyState) {
	h.t.Helper()
	testkit.WaitFor(h.t, fmt.Sprintf("only envoy %d running", st.PID), func() bool {
		return slices.Equal(h.alive(), []int{st.PID})
	})
}

// supervise runs Serve as the tree does: again after Envoy exited, until
// ctx is done or Serve stops on purpose. It returns Serve's last error.
func (h *hotHarness) supervise(ctx context.Context) <-chan error {
	out := make(chan error, 1)
	go func() {
		for {
			err := h.svc.Serve(ctx)
			if !errors.Is(err, ErrEnvoyExited) || ctx.Err() != nil {
				out <- err
				return
			}
		}
	}()
	return out
}

// run supervises until the end of the test, when it stops and waits.
func (h *hotHarness) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := h.supervise(ctx)
	h.t.Cleanup(func() { cancel(); <-done })
}

// Ten edits of a file the bootstrap is rendered from, ten hot restarts: a
// client dialling without pause is never refused, readiness never drops,
// and each old epoch exits 0 on its own once the new one has taken over.
// The same edits applied by cold restarts (the opt-in off: Istio's way,
// here the agent restarting Envoy) refuse connections.
func TestHotRestartRefusesNoConnection(t *testing.T) {
	skipIfReal(t)
	const restarts = 10
	h := newHotHarness(t, true, nil, nil)
	h.run()
	h.wait("epoch 0 ready", alone(0))
	d := testkit.StartDialer(h.listen)
	defer d.Stop()
	for n := 1; n <= restarts; n++ {
		h.edit(fmt.Sprintf("v%d", n))
		h.wait(fmt.Sprintf("epoch %d alone", n), alone(n))
	}
	d.Stop()
	accepted, refused, other := d.Counts()
	t.Logf("hot restart: %d restarts, %d connections accepted, %d refused, %d other errors (%s)", restarts, accepted, refused, other, d.LastError())
	if refused != 0 || other != 0 || accepted == 0 {
		t.Fatalf("across %d hot restarts: %d accepted, %d refused, %d other errors (last %q); want none refused",
			restarts, accepted, refused, other, d.LastError())
	}
	for _, st := range h.state.All() {
		if st.Phase != messages.EnvoyReady && st.RestartEpoch > 0 || st.Phase == messages.EnvoyExited {
			t.Errorf("published %v (epoch %d, pid %d) during the hot restarts: readiness dropped", st.Phase, st.RestartEpoch, st.PID)
		}
	}
	final, _ := h.state.Get()
	h.onlyServing(final)
	// /debug/tree shows the envoy service's health reason: the epochs.
	if !h.sawHealth(messages.Ready, "hot restart: epoch 9 (pid") || !h.sawHealth(messages.Ready, "epoch 10 (pid") {
		t.Errorf("no health report named the overlap's epochs")
	}
	// Only the ends are quoted: the whole log follows the failure, and
	// CI cuts long output short where the cause would be.
	var ends []string
	for _, line := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(line, "hot restart done") || strings.Contains(line, "envoy exited") || strings.Contains(line, "outlived") {
			ends = append(ends, line)
		}
	}
	if got := strings.Join(ends, "\n"); strings.Count(got, "hot restart done: the old epoch exited") != restarts || strings.Contains(got, "with an error") {
		t.Errorf("want %d old epochs exited 0, got %d ends:\n%s", restarts, len(ends), got)
	}
	h.logs.WaitLine(t, "hot restart: the new epoch took over", "old_epoch=9", "new_epoch=10", "reason=\"changed: "+h.input)
}

// The old epoch exits (at its child's request, parent_shutdown_time after
// the child turned ready) before the agent's readiness poll has seen the
// new epoch ready: a loaded machine, or a slow poll, as here. That is the
// end of a hot restart, not the serving Envoy dying: the new epoch takes
// over and readiness never drops (TestHotRestartRefusesNoConnection
// failed this way under make test's load).
func TestHotRestartOldExitsBeforeThePollSeesTheNew(t *testing.T) {
	skipIfReal(t)
	h := newHotHarness(t, true, nil, func(cfg *Config) {
		// Longer than the parent shutdown time (1 s): the poll's next
		// question comes after the old epoch has gone.
		cfg.ReadyPollInterval = 3 * time.Second
	})
	h.run()
	h.wait("epoch 0 ready", alone(0))
	h.edit("v1")
	h.wait("epoch 1 alone", alone(1))
	for _, st := range h.state.All() {
		if st.Phase != messages.EnvoyReady && st.RestartEpoch > 0 || st.Phase == messages.EnvoyExited {
			t.Errorf("published %v (epoch %d, pid %d) during the hot restart: readiness dropped", st.Phase, st.RestartEpoch, st.PID)
		}
	}
	h.logs.WaitLine(t, "hot restart done: the old epoch exited", "old_epoch=0")
	if got := h.logs.String(); strings.Contains(got, "the serving envoy exited during a hot restart") {
		t.Errorf("the old epoch's exit was taken for a crash:\n%s", got)
	}
}

func TestColdRestartRefusesConnections(t *testing.T) {
	skipIfReal(t)
	const restarts = 10
	h := newHotHarness(t, false, nil, nil)
	d := (*testkit.Dialer)(nil)
	for n := 0; n <= restarts; n++ {
		h.edit(fmt.Sprintf("v%d", n))
		ctx, cancel := context.WithCancel(context.Background())
		errc := h.serve(ctx)
		h.wait(fmt.Sprintf("envoy %d ready", n), func(st messages.EnvoyState) bool { return ready(st) && st.Epoch == n })
		if d == nil {
			d = testkit.StartDialer(h.listen)
			defer d.Stop()
		}
		if n == restarts {
			d.Stop()
		}
		cancel()
		h.waitServe(errc)
	}
	accepted, refused, other := d.Counts()
	t.Logf("cold restart: %d restarts, %d connections accepted, %d refused, %d other errors", restarts, accepted, refused, other)
	if refused == 0 {
		t.Fatalf("across %d cold restarts no connection was refused (%d accepted): the test does not see what a restart costs", restarts, accepted)
	}
}

// A new Envoy binary installed over the old one (written beside it and
// renamed into place, as a package manager does) is picked up by a hot
// restart; the same binary installed again is not.
func TestHotRestartNewBinary(t *testing.T) {
	skipIfReal(t)
	bin := filepath.Join(t.TempDir(), "envoy")
	old := testkit.InstallExecutable(t, envoyBinary, bin)
	h := newHotHarness(t, true, nil, func(cfg *Config) { cfg.BinaryPath = bin })
	h.run()
	first := h.wait("epoch 0 ready", alone(0))
	// The same content in a new file (a package reinstalled) is the same
	// binary: compared with the running one's, no restart.
	tmp := bin + ".new"
	if err := os.WriteFile(tmp, old, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	h.logs.WaitLine(t, "envoy's inputs changed but not its bootstrap, command line or binary")
	h.stillAlone(first, "after the same binary was installed again")
	// Trailing bytes change the file, not the program.
	if err := os.WriteFile(tmp, append(old, "new build"...), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	st := h.wait("epoch 1 alone", alone(1))
	h.logs.WaitLine(t, "hot restart: validating the new bootstrap", "what=binary")
	h.onlyServing(st)
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", st.PID))
	if err != nil || exe != bin {
		t.Fatalf("epoch 1 runs %q (%v), want %s", exe, err, bin)
	}
}

// An edit that renders the same bootstrap restarts nothing; one that does
// not validate is refused: the old Envoy keeps serving, its bootstrap file
// is written back, and the next good edit restarts as epoch 1.
func TestHotRestartSameAndInvalidBootstrap(t *testing.T) {
	skipIfReal(t)
	h := newHotHarness(t, true, nil, nil)
	h.run()
	first := h.wait("epoch 0 ready", alone(0))
	path := configPathArg(cmdline(t, first.PID))
	boot, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h.edit("v0") // same content, new file
	h.logs.WaitLine(t, "envoy's inputs changed but not its bootstrap")
	h.edit("invalid")
	h.logs.WaitLine(t, "hot restart refused", "does not validate")
	h.stillAlone(first, "after an invalid bootstrap")
	if now, err := os.ReadFile(path); err != nil || string(now) != string(boot) {
		t.Fatalf("after an invalid bootstrap the file is not the running envoy's again (%v):\n%s\nwant\n%s", err, now, boot)
	}
	h.edit("v1")
	st := h.wait("epoch 1 alone", alone(1))
	h.onlyServing(st)
	if args := cmdline(t, st.PID); !slices.Contains(args, "--restart-epoch") || slices.Contains(args, "--disable-hot-restart") {
		t.Fatalf("epoch 1's command line %q: want --restart-epoch, no --disable-hot-restart", args)
	}
}

// cmdline is the arguments process pid runs with.
func cmdline(t *testing.T, pid int) []string {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")[1:]
}
