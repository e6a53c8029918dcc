package envoy

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"github.com/meshagent/meshagent/messages"
)

// child is one running Envoy process.
type child struct {
	cmd   *exec.Cmd
	pid   int
	epoch int
	// restartEpoch is Envoy's --restart-epoch (always 0 without hot
	// restart, #25).
	restartEpoch int
	started      time.Time
	// stderr keeps the end of Envoy's stderr for a crash record.
	stderr *tailBuffer
	// done is closed when the process has exited and been reaped; waitErr
	// is then Wait's result.
	done    chan struct{}
	waitErr error
}

// start prepares the bootstrap and arguments and starts Envoy with no
// Envoy beside it. It never leaves a process behind when it fails.
func (s *Service) start() (*child, error) {
	if err := checkBinary(s.cfg.BinaryPath); err != nil {
		return nil, err
	}
	args, err := s.prepare()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPrepare, err)
	}
	if s.cfg.HotRestart != nil {
		// A start without a live Envoy beside it is epoch 0: it has no
		// parent, whatever came before, and starts Envoy's shared memory
		// afresh (#25).
		s.hotBlocked = ""
		if s.gen, err = newGeneration(s.cfg, args, s.bootstrap); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrPrepare, err)
		}
	}
	return s.spawn(s.cfg, args, 0)
}

// spawn starts Envoy as cfg says, with args, as restart epoch restartEpoch
// when hot restart is on (HotRestartConfig.args). It never leaves a process
// behind when it fails.
func (s *Service) spawn(cfg Config, args []string, restartEpoch int) (*child, error) {
	if hr := cfg.HotRestart; hr != nil {
		args = hr.args(args, restartEpoch)
	}
	cmd := exec.Command(cfg.BinaryPath, args...)
	cmd.Env = cfg.Env
	// Envoy's stderr goes where it always went and, through a pipe, into
	// the tail a crash record keeps (crashes.go).
	tail := newTailBuffer(StderrTailBytes)
	cmd.Stdout, cmd.Stderr = cfg.Stdout, io.MultiWriter(cfg.Stderr, tail)
	// Envoy gets its own process group, so that a signal sent to the
	// agent's group (a terminal's ^C, say) does not reach it behind our
	// back, and SIGKILL from the kernel when the thread that started it
	// dies, so that a dead agent never leaves an Envoy holding the ports.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if c := cfg.RunAs; c != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID}
	}
	// If Envoy's output is a pipe rather than a file, a grandchild holding
	// it must not keep Wait from returning.
	cmd.WaitDelay = time.Second

	// Pdeathsig is tied to the OS thread that forks, not to the process:
	// keep this goroutine on one thread across Start. The runtime only
	// ends a thread whose goroutine exits while locked, which this one
	// does not, so the thread lives as long as the agent.
	runtime.LockOSThread()
	err := cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", cfg.BinaryPath, err)
	}
	c := &child{cmd: cmd, pid: cmd.Process.Pid, epoch: s.epoch, restartEpoch: restartEpoch, started: s.clock.Now(), stderr: tail, done: make(chan struct{})}
	s.epoch++
	go func() {
		c.waitErr = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// checkBinary says clearly, naming the path, why Envoy cannot be run.
func checkBinary(path string) error {
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s does not exist (set ProxyConfig.binaryPath)", ErrBinary, path)
	case err != nil:
		return fmt.Errorf("%w: %s: %v", ErrBinary, path, err)
	case st.IsDir():
		return fmt.Errorf("%w: %s is a directory", ErrBinary, path)
	case !st.Mode().IsRegular():
		// A FIFO or a device: never a program, and never read (#33).
		return fmt.Errorf("%w: %s is not a regular file (mode %v)", ErrBinary, path, st.Mode())
	case st.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("%w: %s is not executable (mode %v)", ErrBinary, path, st.Mode().Perm())
	}
	return nil
}

// wait blocks until the process has exited and been reaped.
func (c *child) wait() { <-c.done }

// exitStatus is the exit code (-1 when killed by a signal) and how it ended.
// Only valid after done is closed.
func (c *child) exitStatus() (int, string) {
	st := c.cmd.ProcessState
	if st == nil {
		return -1, fmt.Sprintf("not reaped: %v", c.waitErr)
	}
	return st.ExitCode(), st.String()
}

// terminate sends SIGTERM, then SIGKILL after grace, and waits for the exit.
// Process.Signal goes through a pidfd, so a signal can never reach another
// process that reused the pid.
func (c *child) terminate(grace time.Duration, clock messages.Clock, log *slog.Logger) {
	select {
	case <-c.done:
		return
	default:
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		log.Warn("SIGTERM envoy", "pid", c.pid, "error", err)
	}
	select {
	case <-c.done:
		return
	case <-clock.After(grace):
	}
	log.Warn("envoy did not exit after SIGTERM; killing it", "pid", c.pid, "grace", grace)
	c.kill(log)
}

// kill sends SIGKILL and waits for the exit: a stop that runs none of
// Envoy's shutdown. A hot-restart child's shutdown first asks its parent to
// terminate (server.cc, InstanceImpl::shutdown: sendParentTerminateRequest),
// so SIGTERM to a new epoch that never took over would take the serving one
// down with it.
func (c *child) kill(log *slog.Logger) {
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		log.Error("SIGKILL envoy", "pid", c.pid, "error", err)
	}
	<-c.done
}
