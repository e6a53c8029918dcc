package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/meshagent/meshagent/cmd/internal/initproc"
	"github.com/meshagent/meshagent/cmd/meshagent/config"
)

// leanInit is the init the image ships beside the agent (cmd/meshagent-init).
const leanInit = "meshagent-init"

// runAsInit handles the case where the agent is PID 1 (a container's
// ENTRYPOINT without an init): orphaned processes are re-parented to PID 1
// and someone must reap them, but reaping with wait4(-1) in the agent
// itself would steal the exit status of the agent's own children (Envoy,
// iptables-restore) from os/exec. So PID 1 becomes a minimal init that runs
// the agent as its only child (package initproc).
//
// That init is meshagent-init when it is installed beside the agent: PID 1
// replaces itself with it, so that the agent's large binary does not stay
// resident twice (#24). Without it, this process is the init. The image
// `meshagent image` builds starts meshagent-init itself, in front of the
// agent (#36), so that the agent's binary is started once; this path is for
// the agent started as PID 1 all the same (a pod that overrides command:).
//
// It returns false when the process is not PID 1 and the caller should run
// the agent itself.
func runAsInit() (exitCode int, handled bool) {
	if os.Getpid() != 1 {
		return 0, false
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "meshagent: as PID 1, cannot find own executable: %v\n", err)
		return 1, true
	}
	env := config.Process().All() // this process only starts the agent: the agent reads its own
	lean := filepath.Join(filepath.Dir(self), leanInit)
	err = syscall.Exec(lean, append([]string{lean, self}, os.Args...), env)
	if !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "meshagent: as PID 1, cannot run %s (%v): this process stays the init\n", lean, err)
	}
	return initproc.Run(self, os.Args, env), true
}
