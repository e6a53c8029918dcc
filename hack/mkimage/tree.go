package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// tree is the content of one image layer: entries by absolute path, written
// sorted with every parent directory first, all timestamps at the epoch, so
// that the same inputs give the same layer digest.
type tree struct {
	entries map[string]*tar.Header
	data    map[string][]byte // regular files' content
	hostSrc map[string]string // or the host file it is read from at write time
}

func newTree() *tree {
	return &tree{entries: map[string]*tar.Header{}, data: map[string][]byte{}, hostSrc: map[string]string{}}
}

var epoch = time.Unix(0, 0)

// dir adds a directory (and its parents, root-owned 0755, unless added
// already).
func (t *tree) dir(p string, mode int64, uid, gid int) {
	p = filepath.Clean(p)
	if p == "/" {
		return
	}
	t.parents(p)
	t.entries[p] = &tar.Header{Typeflag: tar.TypeDir, Name: p, Mode: mode, Uid: uid, Gid: gid, ModTime: epoch}
}

// file adds a regular file with content data.
func (t *tree) file(p string, mode int64, uid, gid int, data []byte) {
	p = filepath.Clean(p)
	t.parents(p)
	t.entries[p] = &tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Uid: uid, Gid: gid, Size: int64(len(data)), ModTime: epoch}
	t.data[p] = data
	delete(t.hostSrc, p)
}

// copyFile adds a root-owned regular file read from the host's src.
func (t *tree) copyFile(p, src string, mode int64) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", src)
	}
	p = filepath.Clean(p)
	t.parents(p)
	t.entries[p] = &tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Size: fi.Size(), ModTime: epoch}
	t.hostSrc[p] = src
	delete(t.data, p)
	return nil
}

// symlink adds p pointing at target (as written, relative or absolute).
func (t *tree) symlink(p, target string) {
	p = filepath.Clean(p)
	t.parents(p)
	t.entries[p] = &tar.Header{Typeflag: tar.TypeSymlink, Name: p, Linkname: target, Mode: 0o777, ModTime: epoch}
}

func (t *tree) parents(p string) {
	for d := filepath.Dir(p); d != "/" && d != "."; d = filepath.Dir(d) {
		if _, ok := t.entries[d]; ok {
			return // its parents were added with it
		}
		t.entries[d] = &tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch}
	}
}

// tar writes the layer. Names are relative ("usr/local/bin/envoy"), as
// docker and containerd write them.
func (t *tree) tar() ([]byte, error) {
	paths := make([]string, 0, len(t.entries))
	for p := range t.entries {
		paths = append(paths, p)
	}
	sort.Strings(paths) // a parent sorts before its children
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		h := *t.entries[p]
		h.Name = strings.TrimPrefix(p, "/")
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if err := t.writeContent(tw, p, h.Size); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (t *tree) writeContent(w io.Writer, p string, size int64) error {
	if src, ok := t.hostSrc[p]; ok {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		if n, err := io.Copy(w, f); err != nil || n != size {
			return fmt.Errorf("%s: copied %d of %d bytes: %v (changed while packing?)", src, n, size, err)
		}
		return nil
	}
	_, err := w.Write(t.data[p])
	return err
}
