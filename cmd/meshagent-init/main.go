// Command meshagent-init is the init the sidecar image ships beside the
// agent (#24) and, since #36, the image's ENTRYPOINT in front of it:
// ["/usr/local/bin/meshagent-init", "/usr/local/bin/pilot-agent",
// "pilot-agent"], the kubelet appending the injector's args (proxy sidecar
// ...).
//
// As PID 1 it starts the agent as its only child and supervises it
// (package initproc): orphans re-parented to PID 1 are reaped here, not in
// the agent, where wait4(-1) would steal os/exec's exit statuses. Not PID 1
// (a pod with shareProcessNamespace, where PID 1 is the pause process, or
// a hand-run), it replaces itself with the agent: no extra process, as the
// agent run directly.
//
// Before #36 the image's ENTRYPOINT was the agent itself, which as PID 1
// replaced itself with this init, which started the agent again: the 31 MB
// agent's runtime and package initialisation ran twice per pod (26 ms of
// CPU against 11.5 run directly, tenths of a second in a start storm's
// starved containers). The agent still does so when it is PID 1 itself (a
// pod that overrides command:), cmd/meshagent/reaper.go.
//
// Usage: meshagent-init AGENT ARGV0 [ARG...]
package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/meshagent/meshagent/cmd/internal/initproc"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: meshagent-init AGENT ARGV0 [ARG...] (the image's entrypoint: AGENT is the agent's path, ARGV0 its name)")
		os.Exit(2)
	}
	agent, argv := os.Args[1], os.Args[2:]
	if os.Getpid() == 1 {
		os.Exit(initproc.Run(agent, argv, os.Environ()))
	}
	err := syscall.Exec(agent, argv, os.Environ())
	// Only a failed exec returns; the codes are a shell's for the same.
	fmt.Fprintf(os.Stderr, "meshagent-init: cannot run the agent %s: %v\n", agent, err)
	if errors.Is(err, fs.ErrNotExist) {
		os.Exit(127)
	}
	os.Exit(126)
}
