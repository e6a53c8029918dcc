package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ProcStat reads /proc/PID/stat: the command name, and the fields after it
// (state first, then ppid, ...; proc(5) numbers them from 3).
func ProcStat(pid int) (comm string, fields []string, err error) {
	return readStat(fmt.Sprintf("/proc/%d/stat", pid))
}

// readStat reads a stat file of proc(5): a process's, or one of its
// threads' (/proc/PID/task/TID/stat, the same format).
func readStat(path string) (comm string, fields []string, err error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
	// pid (comm) STATE ...: comm may hold spaces and parentheses, so the
	// fields follow the last ')'.
	s := string(raw)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", nil, fmt.Errorf("%s: %q", path, s)
	}
	return s[open+1 : closing], strings.Fields(s[closing+1:]), nil
}

// IsStopped reports a process every thread of which is stopped (state T,
// as SIGSTOP leaves it): kill returns before a thread running on another
// CPU has stopped. False when there is no such process or /proc cannot
// tell.
func IsStopped(pid int) bool {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	for _, f := range tasks {
		if _, fields, err := readStat(f); err != nil || len(fields) == 0 || fields[0] != "T" {
			return false
		}
	}
	return len(tasks) > 0
}

// IsZombie reports a process that has exited but not been reaped: its
// pid still answers a signal, yet it runs no more. False when there is no
// such process (already reaped) or /proc cannot tell.
func IsZombie(pid int) bool {
	_, fields, err := ProcStat(pid)
	return err == nil && len(fields) > 0 && fields[0] == "Z"
}

// CleanupEnvoySharedMemory removes, when the test ends, the hot-restart
// shared memory region that Envoy (and the stand-in, as Envoy does) leaves
// behind for base id baseID: /dev/shm/envoy_shared_memory_<baseID*10>.
func CleanupEnvoySharedMemory(t testing.TB, baseID int) {
	t.Cleanup(func() { os.Remove(fmt.Sprintf("/dev/shm/envoy_shared_memory_%d", baseID*10)) })
}
