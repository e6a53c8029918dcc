package testkit

import (
	"os"
	"path/filepath"
	"testing"
)

// ShortTempDir is a temp directory removed at the end of the test, with a
// short path: a unix socket's path is limited to 107 bytes, and
// t.TempDir's (named after the test) can be longer.
func ShortTempDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// WriteFile writes data to path, owner-only, creating its directories.
func WriteFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// ReplaceFile replaces path as most tools do: a new file written beside it
// and renamed over it, so that a reader never sees half of it and a
// watcher sees a create, not a write.
func ReplaceFile(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	WriteFile(t, tmp, data)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// ProjectVolume writes files (by name) into dir as the kubelet updates a
// ConfigMap or Secret volume (pkg/volume/util/atomic_writer.go): the files
// go into a new hidden generation directory, a "..data_tmp" symlink to it
// is renamed over "..data", each file is a "name -> ..data/name" symlink
// (made on first use), and the previous generation is removed. No event
// names a file itself: a watcher on the file's inode, or one that filters
// events on the file's name, misses the update.
func ProjectVolume(t testing.TB, dir string, files map[string][]byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	gen, err := os.MkdirTemp(dir, "..generation_")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		WriteFile(t, filepath.Join(gen, name), data)
	}
	data := filepath.Join(dir, "..data")
	previous, _ := os.Readlink(data) // "" on the first projection
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(gen), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, data); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			t.Fatal(err)
		}
	}
	if previous != "" {
		if err := os.RemoveAll(filepath.Join(dir, previous)); err != nil {
			t.Fatal(err)
		}
	}
}

// InstallExecutable copies the program at src to dst, mode 0755, and
// returns its bytes: a binary another user may run, or one the test later
// replaces.
func InstallExecutable(t testing.TB, src, dst string) []byte {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return b
}
