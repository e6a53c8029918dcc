// Package boundedfile reads a file that someone other than the agent names
// or writes (an SDS client's file-root:/file-cert: paths, mounted
// certificates, the mesh file, bootstrap templates, the name-table file,
// the XDS proxy's cache) the one safe way: only a regular file, and never
// more than a bound. os.ReadFile of /dev/zero or /dev/urandom reads without
// end until the kernel kills the agent, and of a FIFO blocks for ever with
// no log line naming it (issue #21).
package boundedfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

var (
	// ErrNotRegular: the path names something other than a regular file
	// (a device, a FIFO, a socket, a directory).
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge: the file is larger than the bound the caller gave.
	ErrTooLarge = errors.New("file too large")
)

// MaxPEM bounds a PEM file: a certificate chain, a key, a CA bundle, the OS
// trust store. A chain and key are a few KiB; the largest trust store in
// common use (Debian's ca-certificates.crt, ~140 certificates) is about
// 220 KiB: 1 MiB leaves four times that.
const MaxPEM = 1 << 20

// MaxConfig bounds a configuration file a person or a ConfigMap wrote: the
// mesh file, a bootstrap template or override, the pod's Downward API
// labels and annotations. Kubernetes holds a ConfigMap to 1 MiB (and all
// of a pod's annotations to 256 KiB); 16 MiB leaves room for files
// written by hand on a VM, and is still a bounded cost.
const MaxConfig = 16 << 20

// MaxToken bounds a JWT file (the service account token): a few KiB.
const MaxToken = 1 << 20

// MaxBinary bounds a program the agent hashes (Envoy's binary, for a hot
// restart, #33): Envoy's release binary is about 130 MiB with symbols
// stripped and 400 MiB with them (a debug build); 1 GiB is more than twice
// that, and hashing it is a few seconds, not for ever.
const MaxBinary = 1 << 30

// Read returns the content of the regular file at path, or an error naming
// the path: ErrNotRegular (with the file's type), ErrTooLarge (with the
// bound), or the file system's error (fs.ErrNotExist for a missing file,
// as os.ReadFile returns it).
func Read(path string, max int64) ([]byte, error) {
	f, fi, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAll(f, fi, max)
}

// Open opens the regular file at path for reading and returns its
// FileInfo, for a caller that needs both (the owner and mode of the XDS
// proxy's cache). Something other than a regular file is ErrNotRegular.
//
// The path is stat'ed before it is opened, so that a device is never
// opened at all (opening one can act: /dev/watchdog arms the watchdog, a
// tape device rewinds); it is opened with O_NONBLOCK, so that a FIFO
// swapped in between cannot block the open, and O_NOCTTY, so that a
// terminal never becomes the agent's; then the open file is checked again
// (regular, and the file that was stat'ed).
func Open(path string) (*os.File, fs.FileInfo, error) {
	before, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if !before.Mode().IsRegular() {
		return nil, nil, notRegular(path, before)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err == nil && (!fi.Mode().IsRegular() || !os.SameFile(before, fi)) {
		err = notRegular(path, fi)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// ReadOpen reads a file Open returned through the bound.
func ReadOpen(f *os.File, fi fs.FileInfo, max int64) ([]byte, error) {
	return readAll(f, fi, max)
}

// Copy writes the content of the regular file at path to w (a hash, say)
// without holding it, through the same checks and bound as Read: a FIFO
// or a device at path is ErrNotRegular, at once; a file longer than max is
// ErrTooLarge once max bytes were copied (#33: a hash of /dev/zero read
// for ever).
func Copy(w io.Writer, path string, max int64) (int64, error) {
	f, fi, err := Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if fi.Size() > max {
		return 0, tooLarge(path, fi.Size(), max)
	}
	n, err := io.Copy(w, io.LimitReader(f, max+1))
	if err != nil {
		return n, fmt.Errorf("read %s: %w", path, err)
	}
	if n > max {
		return n, tooLarge(path, -1, max)
	}
	return n, nil
}

func readAll(f *os.File, fi fs.FileInfo, max int64) ([]byte, error) {
	// The size stat'ed rejects most oversized files before a byte is read;
	// the limited read catches one that grows while it is read.
	if fi.Size() > max {
		return nil, tooLarge(f.Name(), fi.Size(), max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	if int64(len(b)) > max {
		return nil, tooLarge(f.Name(), -1, max)
	}
	return b, nil
}

func notRegular(path string, fi fs.FileInfo) error {
	return &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w (%s)", ErrNotRegular, describe(fi.Mode()))}
}

func tooLarge(path string, size, max int64) error {
	if size < 0 {
		return &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: more than %d bytes (the bound)", ErrTooLarge, max)}
	}
	return &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: %d bytes, more than %d (the bound)", ErrTooLarge, size, max)}
}

// describe names a file type as ls would think of it.
func describe(m fs.FileMode) string {
	switch {
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "mode " + m.String()
}
