package boundedfile

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, n int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, bytes.Repeat([]byte("x"), n), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	linkToZero := filepath.Join(dir, "zero-link")
	if err := os.Symlink("/dev/zero", linkToZero); err != nil {
		t.Fatal(err)
	}
	linkToFile := filepath.Join(dir, "file-link")
	if err := os.Symlink(file("target", 3), linkToFile); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		path    string
		size    int // wanted length, when no error
		wantErr error
		wantMsg string
	}{
		{"small file", file("small", 10), 10, nil, ""},
		{"at the bound", file("exact", 100), 100, nil, ""},
		{"empty", file("empty", 0), 0, nil, ""},
		{"over the bound", file("big", 101), 0, ErrTooLarge, "101 bytes, more than 100"},
		{"symlink to a file", linkToFile, 3, nil, ""},
		// os.ReadFile reads these without end (issue #21).
		{"/dev/zero", "/dev/zero", 0, ErrNotRegular, "/dev/zero: not a regular file (a character device)"},
		{"/dev/urandom", "/dev/urandom", 0, ErrNotRegular, "a character device"},
		{"symlink to /dev/zero", linkToZero, 0, ErrNotRegular, "zero-link"},
		// os.ReadFile blocks on this for ever.
		{"FIFO", fifo, 0, ErrNotRegular, "a FIFO"},
		{"directory", dir, 0, ErrNotRegular, "a directory"},
		{"missing", filepath.Join(dir, "missing"), 0, fs.ErrNotExist, "missing"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Read(tc.path, 100)
			if tc.wantErr == nil {
				if err != nil || len(b) != tc.size {
					t.Fatalf("Read(%s) = %d bytes, %v; want %d bytes", tc.path, len(b), err, tc.size)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Read(%s) = %v, want %v", tc.path, err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("Read(%s) = %q, want it to name the path and say %q", tc.path, err, tc.wantMsg)
			}
		})
		// Copy (a hash of Envoy's binary, #33) takes the same checks.
		t.Run("Copy "+tc.name, func(t *testing.T) {
			var out bytes.Buffer
			n, err := Copy(&out, tc.path, 100)
			if tc.wantErr == nil {
				if err != nil || n != int64(tc.size) || out.Len() != tc.size {
					t.Fatalf("Copy(%s) = %d bytes, %v; want %d bytes", tc.path, n, err, tc.size)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("Copy(%s) = %v, want %v saying %q", tc.path, err, tc.wantErr, tc.wantMsg)
			}
			if out.Len() > 101 {
				t.Errorf("Copy(%s) wrote %d bytes past a bound of 100", tc.path, out.Len())
			}
		})
	}
}

// A file that grows past the bound after it was stat'ed is still cut at
// the bound: the read is limited, not only the size checked.
func TestReadOpenLimitsTheRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "growing")
	if err := os.WriteFile(p, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, fi, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.WriteFile(p, bytes.Repeat([]byte("y"), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadOpen(f, fi, 100); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "more than 100 bytes") {
		t.Errorf("ReadOpen of a file grown past the bound = %v, want ErrTooLarge", err)
	}
}
