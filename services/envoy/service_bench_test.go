package envoy

import (
	"context"
	"errors"
	"io"
	"os/exec"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// Baseline: what starting and reaping the same binary costs with plain
// os/exec, without the service. Compare the benchmarks below against it.
func BenchmarkBaselineExecStart(b *testing.B) {
	args, err := writeBootstrapArgs(b.TempDir(), testkit.FreePort(b))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		cmd := exec.Command(envoyBinary, args...)
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		b.StartTimer()
	}
}

// Serve called → EnvoyState.Running published (bootstrap written, child
// started in its own process group with Pdeathsig).
func BenchmarkServeToRunning(b *testing.B) {
	h := newHarness(b, nil, nil)
	b.ResetTimer()
	for range b.N {
		ctx, cancel := context.WithCancel(context.Background())
		prev, _ := h.state.Get()
		errc := h.serve(ctx)
		h.waitState("running", func(s messages.EnvoyState) bool { return s.Phase.Alive() && s.PID != prev.PID })
		b.StopTimer()
		cancel()
		if err := h.waitServe(errc); !errors.Is(err, context.Canceled) {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// Envoy killed → Serve has reported the exit and returned → the next Serve
// has the next Envoy running: the service's share of an in-process restart
// (the tree's backoff delay not included).
func BenchmarkDeathToNextRunning(b *testing.B) {
	h := newHarness(b, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := h.serve(ctx)
	st := h.waitState("running", running)
	b.ResetTimer()
	for range b.N {
		if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		if err := h.waitServe(errc); !errors.Is(err, ErrEnvoyExited) {
			b.Fatal(err)
		}
		errc = h.serve(ctx)
		prev := st.PID
		st = h.waitState("next running", func(s messages.EnvoyState) bool { return s.Phase.Alive() && s.PID != prev })
	}
	b.StopTimer()
	cancel()
	h.waitServe(errc)
}
