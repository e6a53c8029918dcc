// Package atomicfile writes a file so that its reader (Envoy, a proxyless
// gRPC client, the agent itself after a crash) finds the old content or the
// new one, never half of either: a temporary file in the same directory,
// its mode set, written, synced, then renamed over the old one. What the
// CA's root, the certificates in OUTPUT_CERTS, the gRPC bootstrap and the
// XDS proxy's cache write through.
package atomicfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Write writes data to path with mode. The directory must exist.
func Write(path string, data []byte, mode os.FileMode) error {
	return WriteFunc(path, mode, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFunc is Write for content that write streams to w (unbuffered: a
// writer of many small pieces brings its own buffer and flushes it).
func WriteFunc(path string, mode os.FileMode, write func(w io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing to remove
	err = tmp.Chmod(mode)
	if err == nil {
		err = write(tmp)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
