package sds

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/meshagent/meshagent/messages"
)

// watchRetry is how often a directory that does not exist yet is tried
// again (a volume not mounted yet, a CRL directory a plugged-in CA has not
// created).
const watchRetry = time.Second

// dirWatch is the store's file watcher. It watches directories, not files:
// Kubernetes swaps a "..data" symlink and editors write a temporary file and
// rename it, and a watch on the old inode would see neither (the certs
// service watches its files the same way). Directories are counted, since
// several secrets may live in one, and one that does not exist yet is tried
// again every watchRetry. Used only by the store's goroutine.
type dirWatch struct {
	log     *slog.Logger
	clock   messages.Clock
	w       *fsnotify.Watcher
	refs    map[string]int  // wanted directories
	missing map[string]bool // wanted but not watched yet
	retryC  <-chan time.Time
}

func newDirWatch(log *slog.Logger, clock messages.Clock) (*dirWatch, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("create file watcher: %w", err)
	}
	return &dirWatch{log: log, clock: clock, w: w, refs: map[string]int{}, missing: map[string]bool{}}, nil
}

func (d *dirWatch) close() { d.w.Close() }

func (d *dirWatch) events() <-chan fsnotify.Event { return d.w.Events }
func (d *dirWatch) errors() <-chan error          { return d.w.Errors }

// retry fires when directories that were missing should be tried again; nil
// while none is missing.
func (d *dirWatch) retry() <-chan time.Time { return d.retryC }

// add wants dirs watched.
func (d *dirWatch) add(dirs ...string) {
	for _, dir := range dirs {
		d.refs[dir]++
		if d.refs[dir] == 1 {
			d.start(dir)
		}
	}
}

// remove drops one want of each of dirs.
func (d *dirWatch) remove(dirs ...string) {
	for _, dir := range dirs {
		if d.refs[dir]--; d.refs[dir] > 0 {
			continue
		}
		delete(d.refs, dir)
		if d.missing[dir] {
			delete(d.missing, dir)
			continue
		}
		_ = d.w.Remove(dir) // fails only if it is gone already
	}
}

func (d *dirWatch) start(dir string) {
	if err := d.w.Add(dir); err != nil {
		d.log.Debug("cannot watch directory yet; retrying", "dir", dir, "error", err)
		d.missing[dir] = true
		if d.retryC == nil {
			d.retryC = d.clock.After(watchRetry)
		}
	}
}

// retryMissing tries the missing directories again and returns those it now
// watches.
func (d *dirWatch) retryMissing() []string {
	d.retryC = nil
	var now []string
	for dir := range d.missing {
		delete(d.missing, dir)
		d.start(dir)
		if !d.missing[dir] {
			now = append(now, dir)
		}
	}
	return now
}

// affected returns the watched directories an event concerns: the one the
// file is in, or the directory itself when it was removed (which also ends
// its watch, so it is tried again until it comes back).
func (d *dirWatch) affected(ev fsnotify.Event) []string {
	var out []string
	if dir := filepath.Dir(ev.Name); d.refs[dir] > 0 {
		out = append(out, dir)
	}
	if d.refs[ev.Name] > 0 && ev.Has(fsnotify.Remove) || d.refs[ev.Name] > 0 && ev.Has(fsnotify.Rename) {
		out = append(out, ev.Name)
		_ = d.w.Remove(ev.Name)
		d.missing[ev.Name] = true
		if d.retryC == nil {
			d.retryC = d.clock.After(watchRetry)
		}
	}
	return out
}

// dirs are the wanted directories.
func (d *dirWatch) dirs() []string {
	out := make([]string, 0, len(d.refs))
	for dir := range d.refs {
		out = append(out, dir)
	}
	slices.Sort(out)
	return out
}

// dirsOf is the directories to watch for files: each file's own, and its
// symlink target's when that is elsewhere (a Kubernetes "..data" generation,
// an OS trust store linked from another directory).
func dirsOf(files ...string) []string {
	var out []string
	for _, f := range files {
		out = appendNew(out, filepath.Dir(f))
		if target, err := filepath.EvalSymlinks(f); err == nil {
			out = appendNew(out, filepath.Dir(target))
		}
	}
	return out
}

func appendNew(s []string, v string) []string {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}
