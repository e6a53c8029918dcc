// Package cgroupmem reads the memory limit and usage of the agent's own
// cgroup (v2 memory.max and memory.current, v1 memory.limit_in_bytes and
// memory.usage_in_bytes) and a process's resident memory: the one place the
// agent reads them. The envoy service asks before a hot restart whether the
// container can hold a second Envoy beside the first (#25; the overlap of
// Istio's hot restarts caused OOM kills, istio#27087).
package cgroupmem

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrUnknown: no memory cgroup was found for the process (not on Linux, no
// cgroup file system mounted).
var ErrUnknown = errors.New("memory cgroup unknown")

// Memory is a cgroup's memory limit and usage, in bytes. Limit is 0 when
// the cgroup has none ("max", or v1's huge page-aligned number).
type Memory struct {
	Limit, Usage int64
	// Dir is the cgroup's directory, for messages.
	Dir string
}

// Self reads the memory cgroup of the calling process. root is where "/"
// is ("" or "/" in production; a temp dir holding proc/self/cgroup and
// sys/fs/cgroup/... in tests).
func Self(root string) (Memory, error) {
	if root == "" {
		root = "/"
	}
	data, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return Memory{}, fmt.Errorf("%w: %w", ErrUnknown, err)
	}
	v2, v1 := "", ""
	for line := range strings.SplitSeq(string(data), "\n") {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case hasController(parts[1], "memory"):
			v1 = parts[2]
		}
	}
	fsRoot := filepath.Join(root, "sys/fs/cgroup")
	switch {
	case v1 != "":
		dir := filepath.Join(fsRoot, "memory", v1)
		return read(dir, "memory.limit_in_bytes", "memory.usage_in_bytes")
	case v2 != "":
		// In a container with its own cgroup namespace the path is "/",
		// the mount's root.
		dir := filepath.Join(fsRoot, v2)
		return read(dir, "memory.max", "memory.current")
	}
	return Memory{}, fmt.Errorf("%w: no memory controller in %s", ErrUnknown, filepath.Join(root, "proc/self/cgroup"))
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// v1Unlimited: cgroup v1 says "no limit" with a number near 2^63 rounded
// down to a page; anything above 2^62 is taken as none.
const v1Unlimited = math.MaxInt64 / 2

func read(dir, limitFile, usageFile string) (Memory, error) {
	m := Memory{Dir: dir}
	limit, err := readValue(filepath.Join(dir, limitFile))
	if err != nil {
		return Memory{}, err
	}
	if limit < v1Unlimited {
		m.Limit = limit
	}
	if m.Usage, err = readValue(filepath.Join(dir, usageFile)); err != nil {
		return Memory{}, err
	}
	return m, nil
}

// readValue reads a cgroup file of one number, or "max" (returned as
// math.MaxInt64).
func readValue(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("%w: %w", ErrUnknown, err)
	}
	if err != nil {
		return 0, err
	}
	s := string(bytes.TrimSpace(data))
	if s == "max" {
		return math.MaxInt64, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number", path, s)
	}
	return n, nil
}

// RSS is the resident memory of process pid in bytes (VmRSS in
// /proc/<pid>/status).
func RSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/status: VmRSS %q", pid, v)
		}
		return kb * 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS (a zombie?)", pid)
}
