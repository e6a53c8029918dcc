package envoy

// Faults during a hot restart (#25): afterwards one Envoy serves (none after
// a drain), its epoch number is right, and no Envoy the test saw is left.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

func starting(st messages.EnvoyState) bool {
	return st.Overlap.PID != 0 && st.Overlap.Phase == messages.EnvoyRunning
}

func draining(st messages.EnvoyState) bool {
	return st.Overlap.PID != 0 && st.Overlap.Phase == messages.EnvoyDraining
}

func kill(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// A new epoch that dies at start, or never turns ready (an Envoy waiting
// for ever on its configuration, Istio's initial_fetch_timeout being 0:
// killed once the take-over time is over; before, the two ran side by side
// until the next drain), is a failed epoch: the old Envoy keeps serving (no
// connection refused), and since the failed one left Envoy's shared memory
// marked initializing, the next change waits for Envoy's next cold start,
// which is epoch 0; hot restarts then go on from it.
func TestHotRestartNewEpochFails(t *testing.T) {
	skipIfReal(t)
	for _, tc := range []struct {
		name, env string
		logs      []string // what the failure logs, in order
	}{
		{"crashes at start", "FAKE_ENVOY_EXIT_AT_START=1", nil},
		{"never ready", "FAKE_ENVOY_NEVER_READY=1", []string{"the new epoch did not turn ready in time", "new_epoch=1", "take_over_timeout=4s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHotHarness(t, true, nil, nil)
			h.run()
			first := h.wait("epoch 0 ready", alone(0))
			d := testkit.StartDialer(h.listen)
			defer d.Stop()
			h.setEnv(tc.env)
			h.edit("v1")
			if tc.logs != nil {
				h.logs.WaitLine(t, tc.logs...)
			}
			h.logs.WaitLine(t, "hot restart failed: the new epoch exited before taking over", "old_epoch=0", "new_epoch=1")
			d.Stop()
			if accepted, refused, _ := d.Counts(); refused != 0 || accepted == 0 {
				t.Errorf("while the new epoch failed: %d connections accepted, %d refused; want all accepted", accepted, refused)
			}
			h.stillAlone(first, "after a failed epoch")

			h.setEnv()
			h.edit("v2")
			h.logs.WaitLine(t, "hot restart refused", "marked initializing")

			kill(t, first.PID) // the next start is cold
			cold := h.wait("a cold epoch 0", func(st messages.EnvoyState) bool { return alone(0)(st) && st.PID != first.PID })
			h.edit("v3")
			st := h.wait("epoch 1 after the cold start", alone(1))
			h.onlyServing(st)
			if st.PID == cold.PID {
				t.Fatal("epoch 1 has the cold epoch 0's pid")
			}
		})
	}
}

// A drain that keeps Envoy running (POST /drain) while a new epoch starts
// gives that epoch up and leaves the serving one running: the new epoch is
// killed, since its shutdown (SIGTERM) would ask the serving one to
// terminate too, as Envoy's does.
func TestHotRestartKeepRunningDrainDuringStart(t *testing.T) {
	skipIfReal(t)
	h := newHotHarness(t, true, nil, nil)
	done := h.supervise(context.Background())
	first := h.wait("epoch 0 ready", alone(0))
	h.setEnv("FAKE_ENVOY_NEVER_READY=1")
	h.edit("v1")
	next := h.wait("epoch 1 starting beside epoch 0", starting)
	// The new epoch has reached its parent (Envoy's child asks it to
	// close its admin first).
	h.stderr.WaitLine(t, fmt.Sprintf("fakeenvoy[%d]", first.PID), "shutting down admin due to child startup")
	h.drain.Send(messages.Drain{Reason: "/drain", Exit: false})
	h.logs.WaitLine(t, "stopping the new epoch of a hot restart", "reason=\"drain: /drain\"")
	h.logs.WaitLine(t, "envoy draining; it keeps running until told to exit")
	if !pidGone(next.Overlap.PID) && !testkit.IsZombie(next.Overlap.PID) {
		t.Errorf("the new epoch (pid %d) still runs after the drain gave it up", next.Overlap.PID)
	}
	// Then the pod stops: the exit drain ends the one Envoy, the first,
	// which ran throughout (no exit of it, no cold start in between).
	h.drain.Send(messages.Drain{Reason: "SIGTERM", Exit: true})
	if err := h.waitServe(done); !errors.Is(err, ErrDrained) {
		t.Fatalf("Serve: %v, want ErrDrained", err)
	}
	if log := h.logs.String(); strings.Contains(log, `msg="envoy exited"`) || strings.Count(log, `msg="envoy started"`) != 1 {
		t.Errorf("the serving envoy (pid %d) did not run throughout: it exited, or another started:\n%s", first.PID, log)
	}
}

// Changes during an overlap wait for its end, and then the files as they
// are win: two edits while epoch 1 starts make one more epoch, 2, with the
// last edit, never three Envoys.
func TestHotRestartChangesDuringOverlap(t *testing.T) {
	skipIfReal(t)
	h := newHotHarness(t, true, nil, nil)
	h.run()
	h.wait("epoch 0 ready", alone(0))
	h.setEnv("FAKE_ENVOY_READY_AFTER=1s")
	h.edit("v1")
	h.wait("epoch 1 starting", starting)
	h.edit("v2")
	h.logs.WaitLine(t, "looked at once it is over", "input")
	h.edit("v3")
	st := h.wait("epoch 2 alone", alone(2))
	h.onlyServing(st)
	if len(h.pids) != 3 {
		t.Errorf("envoys started: %v, want 3 (epochs 0, 1, 2)", h.pids)
	}
	boot, err := os.ReadFile(configPathArg(cmdline(t, st.PID)))
	if err != nil || !strings.Contains(string(boot), `"EDIT":"v3"`) {
		t.Fatalf("epoch 2's bootstrap (%v): want the last edit, v3:\n%s", err, boot)
	}
	for _, s := range h.state.All() {
		if s.Overlap.PID != 0 && s.Overlap.PID == s.PID {
			t.Errorf("state %+v names one envoy twice", s)
		}
	}
}

// SIGKILL of either Envoy during either half of the overlap: one Envoy
// serves afterwards, numbered from its own start (a hot restart's child is
// N+1, a cold start 0), and nothing else runs.
func TestHotRestartKillDuringOverlap(t *testing.T) {
	skipIfReal(t)
	for _, tc := range []struct {
		name   string
		during func(messages.EnvoyState) bool
		victim func(messages.EnvoyState) int
		// after: the Envoy that serves at the end, given the old and the
		// new one's pids.
		after func(old, next int) func(messages.EnvoyState) bool
	}{
		{"new epoch while it starts", starting, func(st messages.EnvoyState) int { return st.Overlap.PID },
			// A failed epoch: the old one serves on.
			func(old, _ int) func(messages.EnvoyState) bool {
				return func(st messages.EnvoyState) bool { return alone(0)(st) && st.PID == old }
			}},
		{"old epoch while the new one starts", starting, func(st messages.EnvoyState) int { return st.PID },
			// Envoy's child aborts when its parent is gone as it asks it
			// to drain: the agent starts a cold epoch 0.
			coldStart},
		{"old epoch while it drains", draining, func(st messages.EnvoyState) int { return st.Overlap.PID },
			// The child aborts when it tells its dead parent to terminate.
			coldStart},
		{"new epoch while the old one drains", draining, func(st messages.EnvoyState) int { return st.PID },
			// The drained old one listens no more: stopped, cold start.
			coldStart},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHotHarness(t, true, nil, nil)
			h.run()
			first := h.wait("epoch 0 ready", alone(0))
			h.setEnv("FAKE_ENVOY_READY_AFTER=500ms")
			h.edit("v1")
			st := h.wait("the overlap", tc.during)
			next := st.Overlap.PID
			if draining(st) {
				next = st.PID
			}
			kill(t, tc.victim(st))
			final := h.wait("one envoy serving", tc.after(first.PID, next))
			h.onlyServing(final)
		})
	}
}

func coldStart(old, next int) func(messages.EnvoyState) bool {
	return func(st messages.EnvoyState) bool { return alone(0)(st) && st.PID != old && st.PID != next }
}

// A drain (SIGTERM to the agent) during either half of the overlap drains
// what serves and stops every Envoy.
func TestHotRestartDrainDuringOverlap(t *testing.T) {
	skipIfReal(t)
	for _, tc := range []struct {
		name   string
		during func(messages.EnvoyState) bool
	}{{"while the new epoch starts", starting}, {"while the old epoch drains", draining}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHotHarness(t, true, nil, nil)
			done := h.supervise(context.Background())
			h.wait("epoch 0 ready", alone(0))
			h.setEnv("FAKE_ENVOY_READY_AFTER=500ms")
			h.edit("v1")
			h.wait("the overlap", tc.during)
			h.drain.Send(messages.Drain{Reason: "SIGTERM", Exit: true})
			if err := h.waitServe(done); !errors.Is(err, ErrDrained) {
				t.Fatalf("Serve: %v, want ErrDrained", err)
			}
			if pids := h.alive(); len(pids) > 0 {
				t.Fatalf("envoys still running after the drain: %v", pids)
			}
			if st, _ := h.state.Get(); st.Phase != messages.EnvoyStopped || st.Overlap.PID != 0 {
				t.Fatalf("final state %+v: want stopped, no overlap", st)
			}
		})
	}
}

// A container whose memory limit cannot hold a second Envoy beside the
// running one gets no hot restart, and the log says why.
func TestHotRestartRefusedWithoutRoomForTwo(t *testing.T) {
	skipIfReal(t)
	root := t.TempDir()
	for name, data := range map[string]string{
		"proc/self/cgroup":                 "0::/pod\n",
		"sys/fs/cgroup/pod/memory.max":     fmt.Sprint(8 << 20),
		"sys/fs/cgroup/pod/memory.current": fmt.Sprint(6 << 20),
	} {
		testkit.WriteFile(t, filepath.Join(root, name), []byte(data))
	}
	h := newHotHarness(t, true, nil, nil)
	h.svc.cfg.HotRestart.CgroupRoot = root // before Serve: no race
	h.run()
	first := h.wait("epoch 0 ready", alone(0))
	h.edit("v1")
	h.logs.WaitLine(t, "hot restart refused", "memory limit cannot hold two envoys", "8 MiB limit")
	h.stillAlone(first, "after a refused hot restart")
	// The check comes before envoy --mode validate, which loads the
	// bootstrap as a second Envoy would (#33: the validation was the OOM).
	if strings.Contains(h.logs.String(), "validating the new bootstrap") {
		t.Errorf("envoy --mode validate ran although the memory check refuses:\n%s", h.logs.String())
	}
	if !h.sawHealth(messages.Ready, "memory limit cannot hold two envoys") {
		t.Error("the refusal is not on the envoy line of /debug/tree")
	}
}

// A change of the admin address waits for Envoy's next start: the
// readiness poll and the drains would not find a new epoch there.
func TestHotRestartRefusesANewAdminAddress(t *testing.T) {
	skipIfReal(t)
	h := newHotHarness(t, true, nil, nil)
	h.run()
	first := h.wait("epoch 0 ready", alone(0))
	h.mu.Lock()
	h.reload = func(c *Config) { c.AdminAddr = "127.0.0.1:1" }
	h.mu.Unlock()
	h.edit("v1")
	h.logs.WaitLine(t, "hot restart: envoy's inputs do not make a configuration", "admin address changed")
	h.stillAlone(first, "after a refused hot restart")
}

// A FIFO or an endless device put at Envoy's binary path (#33): the hash
// that compares it with the running binary blocked the run loop for good
// (a FIFO) or read at a full core for ever (/dev/zero's device numbers),
// nothing logged, /debug/tree saying "ready", a good binary put there
// later never applied, SIGTERM not heard. Now the refusal is logged and
// on the envoy line, and a good binary afterwards is a hot restart.
func TestHotRestartBinaryNotAFile(t *testing.T) {
	skipIfReal(t)
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	for _, tc := range []struct {
		name, mode string
		put        func(path string) error
	}{
		{"FIFO", "p", func(p string) error { return syscall.Mkfifo(p, 0o755) }},
		{"endless device", "D", func(p string) error {
			return syscall.Mknod(p, syscall.S_IFCHR|0o755, int(unix.Mkdev(1, 5)))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "envoy")
			good := testkit.InstallExecutable(t, envoyBinary, bin)
			h := newHotHarness(t, true, nil, func(cfg *Config) { cfg.BinaryPath = bin })
			ctx, cancel := context.WithCancel(context.Background())
			done := h.supervise(ctx)
			first := h.wait("epoch 0 ready", alone(0))
			if err := os.Remove(bin); err != nil {
				t.Fatal(err)
			}
			if err := tc.put(bin); err != nil {
				t.Fatal(err)
			}
			h.logs.WaitLine(t, "hot restart", "envoy left alone", bin, "not a regular file")
			testkit.WaitFor(t, "the refusal on the envoy line of /debug/tree", func() bool {
				return h.sawHealth(messages.Ready, "hot restart refused: ") && h.sawHealth(messages.Ready, "not a regular file")
			})
			h.stillAlone(first, "after a binary that is not a file")

			// A good binary afterwards is applied: the loop was not stuck.
			tmp := bin + ".new"
			if err := os.WriteFile(tmp, append(good, "new build"...), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, bin); err != nil {
				t.Fatal(err)
			}
			st := h.wait("epoch 1 alone", alone(1))
			h.onlyServing(st)
			cancel() // SIGTERM: heard, Serve returns
			if err := h.waitServe(done); !errors.Is(err, context.Canceled) {
				t.Fatalf("Serve after the stop: %v", err)
			}
		})
	}
}

// Without a memory cgroup to read, the memory check of a second epoch is
// off: it is said once in the log and on the envoy line of /debug/tree
// (#33: it was skipped without a word).
func TestHotRestartSaysMemoryUnchecked(t *testing.T) {
	skipIfReal(t)
	h := newHotHarness(t, true, nil, nil) // CgroupRoot: an empty directory
	h.run()
	h.wait("epoch 0 ready", alone(0))
	h.edit("v1")
	h.wait("epoch 1 alone", alone(1))
	h.edit("v2")
	h.wait("epoch 2 alone", alone(2))
	if !h.sawHealth(messages.Ready, "no memory check before a hot restart") {
		t.Error("the envoy line never said the memory check is off")
	}
	if n := strings.Count(h.logs.String(), "the memory cgroup cannot be read"); n != 1 {
		t.Errorf("the missing cgroup was logged %d times, want once:\n%s", n, h.logs.String())
	}
}
