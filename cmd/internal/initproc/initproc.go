// Package initproc is the minimal init a container without one needs
// (#20): as PID 1, it runs the agent as its only child, forwards signals to
// it, reaps every process that exits in the PID namespace, and leaves with
// the agent's exit status.
//
// It is its own package, importing only the standard library's process
// and signal parts, so that cmd/meshagent-init (the init the image ships
// beside the agent) stays a small binary: a Go process pays for the package
// initialisation of everything it links, and the agent's own binary as PID
// 1 held 5.6 MiB of anonymous memory doing nothing but wait (#24: that was
// the whole gap between our container's working set and Istio's).
package initproc

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Run starts path with argv (argv[0] is the name the agent is called by:
// pilot-agent or meshagent, for its help and errors) and env, and
// supervises it as init until it exits. It returns the agent's exit
// status (128+signal when killed, as a shell reports it).
//
// Reaping with wait4(-1) here cannot steal an exit status from os/exec:
// the agent's own children (Envoy, iptables-restore) are the agent's, not
// this process's; only orphans are re-parented to PID 1.
func Run(path string, argv, env []string) int {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP,
		syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH)
	child, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "meshagent: as PID 1, cannot start the agent: %v\n", err)
		return 1
	}
	for {
		sig := <-sigs
		if sig != syscall.SIGCHLD {
			_ = child.Signal(sig)
			continue
		}
		if code, exited := reap(child.Pid); exited {
			return code
		}
	}
}

// reap collects every child that has exited; exited reports whether the
// agent (pid) was one of them, with its status.
func reap(agent int) (code int, exited bool) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.ECHILD) {
			return 0, true // no child left at all: the agent is gone too
		}
		if err != nil || pid <= 0 {
			return 0, false
		}
		if pid != agent {
			continue
		}
		switch {
		case ws.Exited():
			return ws.ExitStatus(), true
		case ws.Signaled():
			return 128 + int(ws.Signal()), true
		}
		return 1, true
	}
}
