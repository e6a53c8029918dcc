package memlimit

import (
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

// cgroupRoot is a "/" holding proc/self/cgroup and the v2 cgroup's files.
func cgroupRoot(t *testing.T, max string) string {
	t.Helper()
	root := t.TempDir()
	for name, data := range map[string]string{
		"proc/self/cgroup":                              "0::/kubepods/pod1/c1\n",
		"sys/fs/cgroup/kubepods/pod1/c1/memory.max":     max + "\n",
		"sys/fs/cgroup/kubepods/pod1/c1/memory.current": "1000\n",
	} {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestApply(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name  string
		root  string
		ratio float64
		want  int64
	}{
		{"0.9 of a 1 GiB limit", cgroupRoot(t, "1073741824"), 0.9, 966367641},
		{"the whole limit", cgroupRoot(t, "268435456"), 1, 268435456},
		{"no limit", cgroupRoot(t, "max"), 0.9, 0},
		{"off", cgroupRoot(t, "1073741824"), 0, 0},
		{"no cgroup", t.TempDir(), 0.9, 0},
	} {
		debug.SetMemoryLimit(math.MaxInt64)
		got := Apply(tc.ratio, tc.root, log)
		if got != tc.want {
			t.Errorf("%s: Apply = %d, want %d", tc.name, got, tc.want)
		}
		want := tc.want
		if want == 0 {
			want = math.MaxInt64 // untouched
		}
		if now := debug.SetMemoryLimit(-1); now != want {
			t.Errorf("%s: Go's memory limit = %d, want %d", tc.name, now, want)
		}
	}
}
