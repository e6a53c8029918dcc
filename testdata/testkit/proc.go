package testkit

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// IsZombie reports a process that has exited but not been reaped: its
// pid still answers a signal, yet it runs no more. False when there is no
// such process (already reaped) or /proc cannot tell.
func IsZombie(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) STATE ...: comm may hold spaces and parentheses, so the
	// state follows the last ')'.
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'Z'
}

// CleanupEnvoySharedMemory removes, when the test ends, the hot-restart
// shared memory region that Envoy (and the stand-in, as Envoy does) leaves
// behind for base id baseID: /dev/shm/envoy_shared_memory_<baseID*10>.
func CleanupEnvoySharedMemory(t testing.TB, baseID int) {
	t.Cleanup(func() { os.Remove(fmt.Sprintf("/dev/shm/envoy_shared_memory_%d", baseID*10)) })
}
