package testkit

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// ProcStat reads /proc/PID/stat: the command name, and the fields after it
// (state first, then ppid, ...; proc(5) numbers them from 3).
func ProcStat(pid int) (comm string, fields []string, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", nil, err
	}
	// pid (comm) STATE ...: comm may hold spaces and parentheses, so the
	// fields follow the last ')'.
	s := string(raw)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", nil, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return s[open+1 : closing], strings.Fields(s[closing+1:]), nil
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
