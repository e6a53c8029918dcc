package cgroupmem

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSelf(t *testing.T) {
	for _, tc := range []struct {
		name         string
		files        map[string]string
		limit, usage int64
	}{
		{"v2 with a limit", map[string]string{
			"proc/self/cgroup":                              "0::/kubepods/pod1/c1\n",
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max":     "268435456\n",
			"sys/fs/cgroup/kubepods/pod1/c1/memory.current": "1000\n",
		}, 268435456, 1000},
		{"v2 in a cgroup namespace, no limit", map[string]string{
			"proc/self/cgroup":             "0::/\n",
			"sys/fs/cgroup/memory.max":     "max\n",
			"sys/fs/cgroup/memory.current": "5\n",
		}, 0, 5},
		{"v1", map[string]string{
			"proc/self/cgroup": "12:cpu,cpuacct:/x\n11:memory:/docker/abc\n0::/\n",
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "104857600\n",
			"sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes": "7\n",
		}, 104857600, 7},
		{"v1 unlimited", map[string]string{
			"proc/self/cgroup":                           "11:memory:/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
			"sys/fs/cgroup/memory/memory.usage_in_bytes": "7\n",
		}, 0, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, tc.files)
			m, err := Self(root)
			if err != nil {
				t.Fatal(err)
			}
			if m.Limit != tc.limit || m.Usage != tc.usage {
				t.Fatalf("got limit %d usage %d, want %d %d", m.Limit, m.Usage, tc.limit, tc.usage)
			}
		})
	}
}

func TestSelfUnknown(t *testing.T) {
	if _, err := Self(t.TempDir()); !errors.Is(err, ErrUnknown) {
		t.Fatalf("no /proc/self/cgroup: %v, want ErrUnknown", err)
	}
	root := t.TempDir()
	writeFiles(t, root, map[string]string{"proc/self/cgroup": "0::/gone\n"})
	if _, err := Self(root); !errors.Is(err, ErrUnknown) {
		t.Fatalf("no cgroup directory: %v, want ErrUnknown", err)
	}
}

func TestRSS(t *testing.T) {
	n, err := RSS(os.Getpid())
	if err != nil || n <= 0 {
		t.Fatalf("RSS of the test: %d, %v", n, err)
	}
}
