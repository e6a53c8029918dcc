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
