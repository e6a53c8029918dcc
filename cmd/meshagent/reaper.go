package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
)

// reaperChildEnv marks the agent process started by the PID 1 reaper.
const reaperChildEnv = "MESHAGENT_REAPER_CHILD"

// runAsInit handles the case where the agent is PID 1 (a container's
// ENTRYPOINT without an init): orphaned processes are re-parented to PID 1
// and someone must reap them, but reaping with wait4(-1) in the agent
// itself would steal the exit status of the agent's own children (Envoy,
// iptables-restore) from os/exec. So PID 1 becomes a minimal init: it runs
// the agent as its only child, forwards signals to it, reaps every process
// that exits, and leaves with the agent's exit status.
//
// It returns false when the process is not PID 1 (or is already the child)
// and the caller should run the agent itself.
func runAsInit() (exitCode int, handled bool) {
	env := config.NewReader(config.Process()) // before the commands' own reader: this process only starts the agent
	if _, child := env.Text(reaperChildEnv); os.Getpid() != 1 || child {
		return 0, false
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "meshagent: as PID 1, cannot find own executable: %v\n", err)
		return 1, true
	}
	child := exec.Command(self, os.Args[1:]...)
	child.Args[0] = os.Args[0] // the name it was called by (pilot-agent or meshagent), for its help and errors
	child.Env = append(env.All(), reaperChildEnv+"=1")
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr

	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP,
		syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH)
	if err := child.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "meshagent: as PID 1, cannot start the agent: %v\n", err)
		return 1, true
	}
	agentPID := child.Process.Pid
	for {
		sig := <-sigs
		if sig != syscall.SIGCHLD {
			_ = child.Process.Signal(sig)
			continue
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err != nil || pid <= 0 {
				if errors.Is(err, syscall.ECHILD) {
					return 0, true
				}
				break
			}
			if pid == agentPID {
				switch {
				case ws.Exited():
					return ws.ExitStatus(), true
				case ws.Signaled():
					return 128 + int(ws.Signal()), true
				}
				return 1, true
			}
		}
	}
}
