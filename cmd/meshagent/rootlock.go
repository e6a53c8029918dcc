package main

// One agent per --root (#21). Two agents on the same root share every
// socket and file under it: the second one used to find the first one's
// SDS socket live, take it for an external SDS server and say "the
// certificate provider is off", or fight it for the status port. The first
// agent now holds an flock on a file in ProxyConfig's configPath (Istio's
// ./etc/istio/proxy: the directory the agent must be able to write anyway —
// Envoy's bootstrap and the XDS socket live there, and it is the
// istio-envoy emptyDir in an injected pod, whose root filesystem is
// read-only), and a second agent exits at start naming the first one's PID.
//
// The lock lives as long as the open file: the kernel drops it when the
// agent exits, however it exits, so a stale file never blocks a restart.
// The file stays behind; removing it would race with the next agent taking
// it.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
)

// lockRoot takes the lock in dir (created if missing) and writes this
// process's PID into it. The returned Closer releases it. A lock another
// process holds is errRootLocked, naming that process's PID.
func lockRoot(dir string) (io.Closer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, config.RootLockFile)
	// O_CLOEXEC (os.OpenFile's default): Envoy and other children must not
	// inherit the lock and keep it after the agent is gone.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s holds the lock %s", config.ErrRootLocked, lockHolder(f), path)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// lockHolder names the process whose PID the lock file holds.
func lockHolder(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return "a process (PID not yet written)"
	}
	return describePID(pid)
}

// describePID is "pid N (comm)", or "pid N" when /proc does not say.
func describePID(pid int) string {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return fmt.Sprintf("pid %d", pid)
	}
	return fmt.Sprintf("pid %d (%s)", pid, strings.TrimSpace(string(comm)))
}
