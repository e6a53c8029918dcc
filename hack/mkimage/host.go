package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Without a registry there is no base image to start from: the iptables
// binaries the capture step execs, and the shared libraries they (and a
// dynamically linked agent, such as Istio's pilot-agent built with cgo) load,
// are copied from this host at the same paths. The library closure is read
// from the ELF files themselves (PT_INTERP, DT_NEEDED), not from ldd, so that
// nothing is executed to find it.

// multiarch is Debian's library directory name for this architecture.
func multiarch() (string, error) {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64-linux-gnu", nil
	case "arm64":
		return "aarch64-linux-gnu", nil
	}
	return "", fmt.Errorf("no multiarch directory known for %s", runtime.GOARCH)
}

// libraryDirs are where the dynamic loader looks without an ld.so.cache, in
// its order (Debian's multiarch first).
func libraryDirs(triplet string) []string {
	return []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib64", "/usr/lib64", "/lib", "/usr/lib"}
}

// host copies files from this machine into a tree, with their libraries.
type host struct {
	t       *tree
	libDirs []string
	seen    map[string]bool // ELF files whose closure is added
}

func newHost(t *tree, triplet string) *host {
	return &host{t: t, libDirs: libraryDirs(triplet), seen: map[string]bool{}}
}

// addPath copies the host's p into the tree at the same path, keeping every
// symlink met on the way (a merged /usr's /lib64 -> usr/lib64, a library's
// soname link), so that the loader finds the file by the path it asks for.
// It returns the real path of the file.
func (h *host) addPath(p string) (string, error) {
	return h.addPathDepth(filepath.Clean(p), 0)
}

func (h *host) addPathDepth(p string, depth int) (string, error) {
	if depth > 40 {
		return "", fmt.Errorf("%s: too many symlinks", p)
	}
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := "/"
	for i, part := range parts {
		next := filepath.Join(cur, part)
		fi, err := os.Lstat(next)
		if err != nil {
			return "", err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(next)
			if err != nil {
				return "", err
			}
			h.t.symlink(next, target)
			if !filepath.IsAbs(target) {
				target = filepath.Join(cur, target)
			}
			return h.addPathDepth(filepath.Join(append([]string{target}, parts[i+1:]...)...), depth+1)
		case i < len(parts)-1:
			if !fi.IsDir() {
				return "", fmt.Errorf("%s: not a directory", next)
			}
			if _, ok := h.t.entries[next]; !ok {
				h.t.dir(next, int64(fi.Mode().Perm()), 0, 0)
			}
		case fi.Mode().IsRegular():
			return next, h.t.copyFile(next, next, int64(fi.Mode().Perm()))
		default:
			return "", fmt.Errorf("%s: not a regular file, directory or symlink", next)
		}
		cur = next
	}
	return cur, nil
}

// addWithLibraries copies the host's p and the closure of what it loads.
func (h *host) addWithLibraries(p string) error {
	real, err := h.addPath(p)
	if err != nil {
		return err
	}
	return h.addLibrariesOf(real)
}

// addLibrariesOf copies the loader and the libraries the ELF file p (on the
// host; its place in the image does not matter) needs, recursively. A file
// that is not ELF, or a static one, needs nothing.
func (h *host) addLibrariesOf(p string) error {
	if h.seen[p] {
		return nil
	}
	h.seen[p] = true
	f, err := elf.Open(p)
	if err != nil {
		var format *elf.FormatError
		if errors.As(err, &format) {
			return nil // not ELF: a script, a template
		}
		return err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, prog.Filesz)
		if _, err := prog.ReadAt(b, 0); err != nil {
			return fmt.Errorf("%s: PT_INTERP: %w", p, err)
		}
		interp := strings.TrimRight(string(b), "\x00")
		if _, err := h.addPath(interp); err != nil {
			return fmt.Errorf("%s: loader: %w", p, err)
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	for _, lib := range needed {
		found, err := h.findLibrary(lib)
		if err != nil {
			return fmt.Errorf("%s needs %s: %w", p, lib, err)
		}
		real, err := h.addPath(found)
		if err != nil {
			return err
		}
		if err := h.addLibrariesOf(real); err != nil {
			return err
		}
	}
	return nil
}

var errNoLibrary = errors.New("not found in the library directories")

func (h *host) findLibrary(name string) (string, error) {
	if filepath.IsAbs(name) {
		return name, nil
	}
	for _, d := range h.libDirs {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w %v", errNoLibrary, h.libDirs)
}

// addIptables copies both xtables multi-binaries, their extension modules
// (dlopened by name from the compiled-in XTABLES_LIBDIR, so not in any
// DT_NEEDED) and everything they load, and names every command after them
// in /usr/sbin, as Debian's iptables package does.
func (h *host) addIptables(triplet string) error {
	for _, bin := range []string{"/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-legacy-multi"} {
		if err := h.addWithLibraries(bin); err != nil {
			return fmt.Errorf("iptables (apt-get install iptables): %w", err)
		}
	}
	modules, err := filepath.Glob("/usr/lib/" + triplet + "/xtables/*.so")
	if err != nil || len(modules) == 0 {
		return fmt.Errorf("iptables: no extension modules in /usr/lib/%s/xtables", triplet)
	}
	for _, m := range modules {
		if err := h.addWithLibraries(m); err != nil {
			return err
		}
	}
	for name, target := range iptablesCommands() {
		h.t.symlink("/usr/sbin/"+name, target)
	}
	// Protocol names in rules and in iptables-save's output ("-p tcp")
	// come from here when libxtables' own short table does not have them.
	if _, err := os.Stat("/etc/protocols"); err == nil {
		if _, err := h.addPath("/etc/protocols"); err != nil {
			return err
		}
	}
	return nil
}
