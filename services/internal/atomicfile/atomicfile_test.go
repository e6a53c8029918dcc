package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// The file is replaced whole with its mode, and no temporary file stays
// behind, whether the write succeeds or fails.
func TestWriteReplacesWholeAndLeavesNoTemporary(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("old content"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "new" {
		t.Fatalf("content = %q, %v", b, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, %v; want 0600", fi.Mode(), err)
	}

	failed := errors.New("write failed")
	err = WriteFunc(path, 0o644, func(w io.Writer) error {
		_, _ = w.Write([]byte("half"))
		return failed
	})
	if !errors.Is(err, failed) {
		t.Fatalf("WriteFunc = %v, want the writer's error", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "new" {
		t.Fatalf("a failed write changed the file: %q", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only the file", len(entries))
	}
}
