package envoy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/thejerf/suture/v4"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// pidGone reports whether no process has this pid (it was reaped).
func pidGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func skipIfReal(t *testing.T) {
	if realEnvoy {
		t.Skip("needs fakeenvoy's knobs; MESHAGENT_TEST_ENVOY is set")
	}
}

// Start: Running with a PID, then Ready once admin /ready is LIVE; a cancel
// stops Envoy and leaves no child behind.
func TestStartReadyAndStop(t *testing.T) {
	h := newHarness(t, nil, nil)
	cancel, errc := h.start()

	st := h.waitState("running", running)
	if st.PID <= 0 || st.Epoch != 0 || st.Started.IsZero() {
		t.Fatalf("first state = %+v; want a PID, epoch 0, a start time", st)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", st.PID)); err != nil {
		t.Fatalf("envoy pid %d not in /proc: %v", st.PID, err)
	}
	st = h.waitState("ready", ready)
	// The state is published first, the health just after it (setReady):
	// waited for, not read at once (a make test under load saw the state
	// before the health).
	testkit.WaitFor(t, "health ready", func() bool { return h.sawHealth(messages.Ready, "") })
	if !h.sawHealth(messages.Starting, "") {
		t.Fatalf("health reports %+v; want Starting then Ready", h.health.All())
	}

	cancel()
	if err := h.waitServe(errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve after cancel = %v; want context.Canceled", err)
	}
	final, _ := h.state.Get()
	if final.Phase != messages.EnvoyStopped {
		t.Fatalf("state after stop = %+v; want Stopped, not running", final)
	}
	if !pidGone(st.PID) {
		t.Fatalf("envoy pid %d still exists after Serve returned", st.PID)
	}
	if final.ExitReason != "exit status 0" {
		t.Errorf("exit after SIGTERM = %q; want a clean exit 0", final.ExitReason)
	}
}

// A killed Envoy: the exit is published before Serve returns an error
// carrying "signal: killed"; the next Serve starts a new process, epoch+1.
func TestKilledEnvoyReportedThenRestarted(t *testing.T) {
	h := newHarness(t, nil, nil)
	cancel, errc := h.start()
	first := h.killWhen("ready", ready)
	err := h.waitServe(errc)
	// Serve has returned: the exit must already be published.
	st, _ := h.state.Get()
	if st.Phase != messages.EnvoyExited || st.ExitReason != "signal: killed" || st.ExitCode != -1 || st.PID != first.PID {
		t.Fatalf("state when Serve returned = %+v; want not running, not ready, signal: killed", st)
	}
	if !errors.Is(err, ErrEnvoyExited) || !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("Serve = %v; want ErrEnvoyExited with signal: killed", err)
	}
	var exit *ExitError
	if !errors.As(err, &exit) || exit.PID != first.PID || exit.ExitCode != -1 {
		t.Fatalf("Serve error %#v; want *ExitError for pid %d", err, first.PID)
	}

	cancel, errc = h.start()
	second := h.waitState("second envoy running", func(s messages.EnvoyState) bool { return s.Phase.Alive() && s.PID != first.PID })
	if second.Epoch != first.Epoch+1 {
		t.Fatalf("second epoch = %d; want %d", second.Epoch, first.Epoch+1)
	}
	cancel()
	if err := h.waitServe(errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("second Serve = %v", err)
	}
}

// A crash: the exit status reaches Serve's error and EnvoyState.
func TestCrashExitStatus(t *testing.T) {
	skipIfReal(t)
	for _, code := range []int{1, 3} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			env := []string{"FAKE_ENVOY_CRASH_AFTER=200ms"}
			if code != 1 {
				env = append(env, "FAKE_ENVOY_EXIT_CODE="+strconv.Itoa(code))
			}
			h := newHarness(t, env, nil)
			err := h.waitServe(h.serve(context.Background()))
			want := fmt.Sprintf("exit status %d", code)
			var exit *ExitError
			if !errors.As(err, &exit) || exit.ExitCode != code || !strings.Contains(err.Error(), want) {
				t.Fatalf("Serve = %v; want *ExitError with %s", err, want)
			}
			st, _ := h.state.Get()
			if st.Phase != messages.EnvoyExited || st.ExitCode != code || st.ExitReason != want {
				t.Fatalf("state = %+v", st)
			}
			if !h.sawHealth(messages.Failed, want) {
				t.Fatalf("no Failed health naming %q: %+v", want, h.health.All())
			}
		})
	}
}

// Drain{Exit}: Istio's drain_listeners query, the drain period, then a clean
// SIGTERM exit, Stopped, and no restart.
func TestDrainExit(t *testing.T) {
	h := newHarness(t, nil, nil)
	err := h.drainToExit()
	if !errors.Is(err, suture.ErrDoNotRestart) || !errors.Is(err, ErrDrained) {
		t.Fatalf("Serve after drain = %v; want ErrDrained and suture.ErrDoNotRestart", err)
	}
	st, _ := h.state.Get()
	if st.Phase != messages.EnvoyStopped || st.ExitReason != "exit status 0" {
		t.Fatalf("state = %+v; want stopped after drain, clean exit", st)
	}
	if !h.sawHealth(messages.Starting, "draining") {
		t.Fatalf("no not-ready draining health: %+v", h.health.All())
	}
	if !realEnvoy {
		if got := strings.Count(h.stderr.String(), "drain_listeners?inboundonly&graceful"); got != 1 {
			t.Fatalf("fakeenvoy saw %d drain_listeners?inboundonly&graceful; want 1\n%s", got, h.stderr)
		}
	}
	if !strings.Contains(h.logs.String(), "termination drain duration over") {
		t.Fatalf("drain did not wait the termination drain duration:\n%s", h.logs)
	}
}

// ExitOnZeroActiveConnections: the drain ends when connections reach zero,
// long before the (huge) termination drain duration, and only listener
// stats that Istio counts are counted.
func TestDrainExitOnZeroActiveConnections(t *testing.T) {
	skipIfReal(t)
	h := newHarness(t, []string{"FAKE_ENVOY_ACTIVE_CONNECTIONS=5", "FAKE_ENVOY_DRAIN_SECONDS=1.5"}, func(c *Config) {
		c.ExitOnZeroActiveConnections = true
		c.TerminationDrainDuration = time.Hour
	})
	err := h.drainToExit()
	if !errors.Is(err, ErrDrained) {
		t.Fatalf("Serve = %v; want ErrDrained", err)
	}
	logs := h.logs.String()
	iWait := strings.Index(logs, "waiting for active connections to end")
	iZero := strings.Index(logs, "no more active connections")
	if iWait < 0 || iZero < iWait {
		t.Fatalf("want waits on active connections, then zero:\n%s", logs)
	}
	// The fake reports 5 on the inbound listener plus per-worker, http.,
	// internal-listener and admin duplicates that must not count.
	for _, line := range strings.Split(logs, "\n") {
		if _, v, ok := strings.Cut(line, "active="); ok {
			if n, _ := strconv.Atoi(strings.Fields(v)[0]); n > 5 || n <= 0 {
				t.Fatalf("counted %d active connections; want 1..5: %s", n, line)
			}
		}
	}
}

// Drain without Exit (Istio's POST /drain) keeps Envoy running; a later
// Drain{Exit} stops it at once without draining again.
func TestDrainThenExitLater(t *testing.T) {
	h := newHarness(t, nil, func(c *Config) { c.TerminationDrainDuration = time.Hour })
	errc := h.serve(context.Background())
	first := h.waitState("ready", ready)
	h.drain.Send(messages.Drain{Reason: "POST /drain"})
	h.waitState("draining", func(s messages.EnvoyState) bool { return s.Phase == messages.EnvoyDraining })
	if !realEnvoy {
		testkit.WaitFor(t, "fakeenvoy to record the drain", func() bool {
			return strings.Contains(h.stderr.String(), "drain_listeners?inboundonly&graceful")
		})
	}
	// Istio's POST /drain keeps Envoy running: skip_exit.
	if !realEnvoy {
		if drains := fakeDrains(t, h.admin); !slices.Equal(drains, []string{"inboundonly&graceful&skip_exit"}) {
			t.Fatalf("fakeenvoy recorded drains %q; want [inboundonly&graceful&skip_exit]", drains)
		}
	}
	select {
	case err := <-errc:
		t.Fatalf("Serve returned %v after a drain without Exit", err)
	default:
	}
	if pidGone(first.PID) {
		t.Fatal("envoy gone after a drain without Exit")
	}
	h.drain.Send(messages.Drain{Reason: "SIGTERM", Exit: true})
	if err := h.waitServe(errc); !errors.Is(err, ErrDrained) {
		t.Fatalf("Serve = %v; want ErrDrained", err)
	}
	if !realEnvoy {
		if n := strings.Count(h.stderr.String(), "drain_listeners?"); n != 1 {
			t.Fatalf("drain_listeners called %d times; want once", n)
		}
	}
}

// Drain{Immediate} (Istio's /quitquitquit) stops Envoy without draining.
func TestDrainImmediate(t *testing.T) {
	h := newHarness(t, nil, func(c *Config) { c.TerminationDrainDuration = time.Hour })
	errc := h.serve(context.Background())
	h.waitState("running", running)
	h.drain.Send(messages.Drain{Reason: "quitquitquit", Immediate: true})
	if err := h.waitServe(errc); !errors.Is(err, ErrDrained) || !errors.Is(err, suture.ErrDoNotRestart) {
		t.Fatalf("Serve = %v", err)
	}
	st, _ := h.state.Get()
	if st.Phase != messages.EnvoyStopped {
		t.Fatalf("state = %+v; want stopped without draining", st)
	}
	if strings.Contains(h.stderr.String(), "drain_listeners") {
		t.Fatal("immediate stop drained listeners")
	}
}

// An Envoy that ignores SIGTERM is killed after the grace period.
func TestIgnoredSIGTERMGetsSIGKILL(t *testing.T) {
	skipIfReal(t)
	h := newHarness(t, []string{"FAKE_ENVOY_IGNORE_SIGTERM=1"}, func(c *Config) { c.KillGrace = 300 * time.Millisecond })
	cancel, errc := h.start()
	st := h.waitState("ready", ready)
	cancel()
	if err := h.waitServe(errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve = %v", err)
	}
	final, _ := h.state.Get()
	if final.ExitReason != "signal: killed" || final.Phase != messages.EnvoyStopped {
		t.Fatalf("state = %+v; want killed and stopped", final)
	}
	if !strings.Contains(h.stderr.String(), "ignoring terminated") {
		t.Fatal("fakeenvoy never got SIGTERM before SIGKILL")
	}
	if !pidGone(st.PID) {
		t.Fatal("envoy still exists")
	}
}

// An Envoy that never becomes ready is Running but never Ready, health Starting.
func TestNeverReady(t *testing.T) {
	skipIfReal(t)
	h := newHarness(t, []string{"FAKE_ENVOY_NEVER_READY=1"}, nil)
	cancel, errc := h.start()
	h.waitState("running", running)
	// Let the poller see PRE_INITIALIZING answers a few times.
	time.Sleep(200 * time.Millisecond)
	if st, _ := h.state.Get(); st.Phase == messages.EnvoyReady {
		t.Fatalf("state = %+v; want not ready", st)
	}
	if h.sawHealth(messages.Ready, "") {
		t.Fatal("reported Ready")
	}
	cancel()
	h.waitServe(errc)
}

// Unusable binaries and a bootstrap that cannot be prepared fail Serve
// with a clear error.
func TestStartFailures(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "envoy-not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "no-such-envoy")
	for _, tc := range []struct {
		name    string
		mod     func(*Config)
		is      error
		mention string
	}{
		{"missing", func(c *Config) { c.BinaryPath = missing }, ErrBinary, missing},
		{"not executable", func(c *Config) { c.BinaryPath = notExec }, ErrBinary, notExec},
		{"directory", func(c *Config) { c.BinaryPath = dir }, ErrBinary, dir},
		{"prepare", func(c *Config) {
			b := *c.Bootstrap
			b.CustomConfigFile = "/x/tmpl.json" // missing
			c.Bootstrap = &b
		}, ErrPrepare, "/x/tmpl.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil, tc.mod)
			err := h.waitServe(h.serve(context.Background()))
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("Serve = %v; want %v naming %s", err, tc.is, tc.mention)
			}
			if !h.sawHealth(messages.Failed, tc.mention) {
				t.Fatalf("no Failed health naming %s: %+v", tc.mention, h.health.All())
			}
			if _, set := h.state.Get(); set {
				t.Fatal("EnvoyState published without a process")
			}
		})
	}
}

// A bad config is refused by New, once, naming the field (issue 26: a
// config is validated when the tree is built, never again in Serve).
func TestNewRefusesInvalidConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{BinaryPath: envoyBinary, Bootstrap: testBootstrap(dir, filepath.Join(dir, "envoy-rev.json"), 15000),
		AdminAddr: "localhost", DrainQuery: "inboundonly&graceful"}
	_, err := New(cfg, Inputs{}, Outputs{State: messages.NewCell[messages.EnvoyState]()},
		messages.NewRuntime(Name, &testkit.HealthRecorder{}, nil, nil, testkit.TestLogger(t)))
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "AdminAddr") {
		t.Fatalf("New = %v; want ErrInvalidConfig naming AdminAddr", err)
	}
}

// Pdeathsig: an agent killed with SIGKILL takes its Envoy with it.
func TestParentDeathKillsEnvoy(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), parentEnv+"="+envoyBinary,
		"MESHAGENT_ENVOY_TEST_DIR="+t.TempDir(), "MESHAGENT_ENVOY_TEST_PORT="+strconv.Itoa(testkit.FreePort(t)))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("reading envoy pid from the parent: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "envoy-pid "))
	if err != nil || pid <= 0 {
		t.Fatalf("parent said %q", line)
	}
	if pidGone(pid) {
		t.Fatalf("envoy %d not running before the parent died", pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// Envoy, orphaned, is killed by the kernel and reaped by init (or the
	// nearest subreaper); wait for its pid to disappear (or turn zombie).
	deadline := time.Now().Add(30 * time.Second)
	for !pidGone(pid) && !testkit.IsZombie(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("envoy %d outlived its parent", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runAsParent is the test binary acting as an agent for
// TestParentDeathKillsEnvoy: start Envoy, print its pid, wait to be killed.
func runAsParent() int {
	port, _ := strconv.Atoi(os.Getenv("MESHAGENT_ENVOY_TEST_PORT"))
	dir := os.Getenv("MESHAGENT_ENVOY_TEST_DIR")
	state := messages.NewCell[messages.EnvoyState]()
	boot, err := writeBootstrap(dir, port)
	if err != nil {
		fmt.Fprintln(os.Stderr, "parent: bootstrap:", err)
		return 1
	}
	svc, err := New(Config{
		BinaryPath: os.Getenv(parentEnv),
		Bootstrap:  testBootstrap(dir, boot, port),
		Args:       testArgs,
		AdminAddr:  fmt.Sprintf("127.0.0.1:%d", port),
		DrainQuery: "inboundonly&graceful",
	}, Inputs{}, Outputs{State: state}, messages.NewRuntime(Name, messages.NewStream[messages.Health](0, nil), nil, nil, nil))
	if err != nil {
		fmt.Fprintln(os.Stderr, "parent: New:", err)
		return 1
	}
	errc := make(chan error, 1)
	go func() { errc <- svc.Serve(context.Background()) }()
	for {
		st, ok, changed := state.Watch()
		if ok && st.Phase.Alive() {
			fmt.Printf("envoy-pid %d\n", st.PID)
			break
		}
		select {
		case <-changed:
		case err := <-errc:
			fmt.Fprintln(os.Stderr, "parent: Serve:", err)
			return 1
		}
	}
	// Start Envoy from some other goroutines meanwhile, so that the one
	// that forked Envoy is not special: Pdeathsig must follow the process.
	for range 4 {
		go func() { _ = exec.Command("true").Run() }()
	}
	fmt.Fprintln(os.Stderr, "parent: Serve:", <-errc)
	return 1
}

// A stop asked for while no Envoy runs (between a crash and the restart) is
// honoured by the next Serve without starting Envoy.
func TestStopRequestedBeforeStart(t *testing.T) {
	h := newHarness(t, nil, nil)
	_, errc := h.start()
	first := h.killWhen("running", running)
	if err := h.waitServe(errc); !errors.Is(err, ErrEnvoyExited) {
		t.Fatalf("Serve = %v", err)
	}
	h.drain.Send(messages.Drain{Reason: "SIGTERM", Exit: true})
	_, again := h.start()
	if err := h.waitServe(again); !errors.Is(err, ErrDrained) {
		t.Fatalf("Serve with a pending stop = %v; want ErrDrained", err)
	}
	st, _ := h.state.Get()
	if st.Phase != messages.EnvoyStopped || st.PID != first.PID || st.Epoch != first.Epoch {
		t.Fatalf("state = %+v; want stopped, no new process", st)
	}
}

// A drain without Exit asked for before the start is applied once Envoy runs.
func TestDrainRequestedBeforeStart(t *testing.T) {
	h := newHarness(t, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	h.drain.Send(messages.Drain{Reason: "POST /drain"})
	errc := h.serve(ctx)
	h.waitState("running and draining", func(s messages.EnvoyState) bool { return s.Phase == messages.EnvoyDraining })
	if !realEnvoy {
		testkit.WaitFor(t, "fakeenvoy to record the drain", func() bool {
			return strings.Contains(h.stderr.String(), "drain_listeners?inboundonly&graceful")
		})
	}
	cancel()
	if err := h.waitServe(errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve = %v", err)
	}
}

// RunAs: Envoy runs as uid/gid 1337 (Istio's proxy user) when asked.
func TestRunAs(t *testing.T) {
	testkit.RequireRoot(t, "to start Envoy as uid 1337")
	// Everything Envoy reads must be readable by uid 1337.
	dir := testkit.ShortTempDir(t, "envoy-runas")
	bin := filepath.Join(dir, "envoy")
	testkit.InstallExecutable(t, envoyBinary, bin)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, nil, func(c *Config) {
		c.BinaryPath = bin
		c.RunAs = &Credential{UID: 1337, GID: 1337}
		port := c.AdminAddr[strings.LastIndexByte(c.AdminAddr, ':')+1:]
		p, _ := strconv.Atoi(port)
		boot, err := writeBootstrap(dir, p)
		if err == nil {
			err = os.Chmod(boot, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		c.Bootstrap = testBootstrap(dir, boot, p)
	})
	// Its control plane, on a socket uid 1337 may connect to.
	startControlPlane(t, filepath.Join(dir, "XDS"), minimalMesh(t))
	if err := os.Chmod(filepath.Join(dir, "XDS"), 0o666); err != nil {
		t.Fatal(err)
	}
	cancel, errc := h.start()
	st := h.waitState("ready", ready) // it read its bootstrap as 1337 and spoke xDS
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", st.PID))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Uid:\t1337\t1337\t1337\t1337", "Gid:\t1337\t1337\t1337\t1337"} {
		if !strings.Contains(string(status), want) {
			t.Fatalf("envoy /proc status lacks %q:\n%s", want, status)
		}
	}
	cancel()
	h.waitServe(errc)
}

// A long drain is cut short by the agent stopping or by an immediate stop
// (a second SIGTERM, /quitquitquit).
func TestDrainCutShort(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  func(h *harness, cancel context.CancelFunc)
		want error
	}{
		{"ctx cancelled", func(_ *harness, cancel context.CancelFunc) { cancel() }, context.Canceled},
		{"immediate drain", func(h *harness, _ context.CancelFunc) {
			h.drain.Send(messages.Drain{Reason: "quitquitquit", Immediate: true})
		}, ErrDrained},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil, func(c *Config) { c.TerminationDrainDuration = time.Hour })
			cancel, errc := h.start()
			st := h.waitState("ready", ready)
			h.drain.Send(messages.Drain{Reason: "SIGTERM", Exit: true})
			h.waitState("draining", func(s messages.EnvoyState) bool { return s.Phase == messages.EnvoyDraining })
			tc.cut(h, cancel)
			if err := h.waitServe(errc); !errors.Is(err, tc.want) {
				t.Fatalf("Serve = %v; want %v", err, tc.want)
			}
			if final, _ := h.state.Get(); final.Phase != messages.EnvoyStopped || !pidGone(st.PID) {
				t.Fatalf("state = %+v; want stopped and no envoy", final)
			}
		})
	}
}

// Drain.Deadline overrides the termination drain duration.
func TestDrainDeadline(t *testing.T) {
	h := newHarness(t, nil, func(c *Config) { c.TerminationDrainDuration = time.Hour })
	errc := h.serve(context.Background())
	h.waitState("ready", ready)
	h.drain.Send(messages.Drain{Reason: "SIGTERM", Exit: true, Deadline: time.Now().Add(300 * time.Millisecond)})
	if err := h.waitServe(errc); !errors.Is(err, ErrDrained) {
		t.Fatalf("Serve = %v; want ErrDrained", err)
	}
	if !strings.Contains(h.logs.String(), "termination drain duration over") {
		t.Fatalf("drain did not end at its deadline:\n%s", h.logs)
	}
}

// fakeDrains are the drain_listeners queries the stand-in Envoy at admin
// received, in order.
func fakeDrains(t *testing.T, admin string) []string {
	t.Helper()
	_, body := httpGet(t, "http://"+admin+"/fake/drains")
	var drains []string
	if err := json.Unmarshal([]byte(body), &drains); err != nil {
		t.Fatalf("GET /fake/drains: %v: %q", err, body)
	}
	return drains
}

// The drain query is the config's: a gateway (Istio's "proxy router")
// drains every listener, not only the inbound ones.
func TestGatewayDrainQuery(t *testing.T) {
	skipIfReal(t)
	h := newHarness(t, nil, func(c *Config) { c.DrainQuery = "graceful"; c.TerminationDrainDuration = 0 })
	if err := h.drainToExit(); !errors.Is(err, ErrDrained) {
		t.Fatalf("Serve = %v; want ErrDrained", err)
	}
	if !strings.Contains(h.stderr.String(), "drain_listeners?graceful\n") {
		t.Fatalf("fakeenvoy did not log drain_listeners?graceful:\n%s", h.stderr)
	}
}

// A router (an ambient ingress gateway, a waypoint) drains every listener
// (Istio's drain_listeners?graceful, not inboundonly) and, with
// EXIT_ON_ZERO_ACTIVE_CONNECTIONS, exits once its client connections are
// gone although its HBONE internal listeners (envoy_internal_*) still hold
// pipe connections, as Istio 1.30.3 does (releasenotes 60731,
// pkg/envoy/agent.go activeProxyConnections) (#35). Counting them, the
// drain would last the hour of TerminationDrainDuration.
func TestRouterDrainLeavesHBONEInternalListenersOut(t *testing.T) {
	skipIfReal(t)
	h := newHarness(t, []string{"FAKE_ENVOY_ACTIVE_CONNECTIONS=3", "FAKE_ENVOY_DRAIN_SECONDS=0.2"}, func(c *Config) {
		c.DrainQuery = "graceful" // the config's for proxy type router
		c.ExitOnZeroActiveConnections = true
		c.MinimumDrainDuration = 0
		c.TerminationDrainDuration = time.Hour
	})
	if err := h.drainToExit(); !errors.Is(err, ErrDrained) {
		t.Fatalf("Serve = %v; want ErrDrained", err)
	}
	if !strings.Contains(h.stderr.String(), "drain_listeners?graceful\n") {
		t.Fatalf("fakeenvoy did not log drain_listeners?graceful:\n%s", h.stderr)
	}
	testkit.Contains(t, "the service log", h.logs.String(), "waiting for active connections to end", "no more active connections")
}

// MinimumDrainDuration 0 (MINIMUM_DRAIN_DURATION=0) means no minimum: the
// first look at the active connections is asked for at once, not after a
// default.
func TestMinimumDrainDurationZero(t *testing.T) {
	skipIfReal(t)
	clock := &testkit.RecordingClock{Wait: true}
	h := newHarnessWithClock(t, []string{"FAKE_ENVOY_ACTIVE_CONNECTIONS=0"}, func(c *Config) {
		c.ExitOnZeroActiveConnections = true
		c.MinimumDrainDuration = 0
		c.TerminationDrainDuration = time.Hour
	}, clock)
	if err := h.drainToExit(); !errors.Is(err, ErrDrained) {
		t.Fatalf("Serve = %v; want ErrDrained", err)
	}
	if !strings.Contains(h.logs.String(), "no more active connections") {
		t.Fatalf("the drain did not end on zero connections:\n%s", h.logs)
	}
	if waits := clock.Waits(); !slices.Contains(waits, 0) || slices.Contains(waits, 5*time.Second) {
		t.Fatalf("waits asked of the clock: %v; want the first connection check at once (0), no 5s default", waits)
	}
}

// Readiness is Istio's: not ready, saying why, until Envoy has received its
// clusters and listeners; then ready.
func TestReadyOnlyOnceConfigArrives(t *testing.T) {
	h := newHarness(t, nil, nil)
	h.xds.Clear() // the control plane has nothing yet
	cancel, errc := h.start()
	st := h.waitState("not ready, config not received", func(s messages.EnvoyState) bool {
		return strings.Contains(s.NotReady, "config not received from XDS server")
	})
	if st.Phase != messages.EnvoyRunning {
		t.Fatalf("phase = %v; want running", st.Phase)
	}
	if !h.sawHealth(messages.Starting, "config not received") {
		t.Fatalf("health does not say why: %+v", h.health.All())
	}
	setConfig(t, h.xds, "1", map[resource.Type][]types.Resource{
		resource.ClusterType:  {&clusterv3.Cluster{Name: "c", ConnectTimeout: durationpb.New(time.Second)}},
		resource.ListenerType: {inboundListener(t)},
	})
	h.waitState("ready", ready)
	cancel()
	h.waitServe(errc)
}

// A config Envoy rejects is reported as rejected, with the counts.
func TestNotReadyWhenConfigRejected(t *testing.T) {
	skipIfReal(t)
	h := newHarness(t, []string{"FAKE_ENVOY_REJECT=lds"}, nil)
	cancel, errc := h.start()
	st := h.waitState("rejected", func(s messages.EnvoyState) bool {
		return strings.Contains(s.NotReady, "config received from XDS server, but was rejected")
	})
	if !strings.Contains(st.NotReady, "lds updates: 0 successful, 1 rejected") && !strings.Contains(st.NotReady, "rejected; lds updates: 0 successful") {
		t.Fatalf("reason lacks the counts: %q", st.NotReady)
	}
	cancel()
	h.waitServe(errc)
}
