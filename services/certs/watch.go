package certs

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// fileChanges is a running watch of some files: changed receives (coalesced)
// once the files' directories have been quiet for FileDebounce after a
// change, or when a directory that was missing can be watched at last;
// failed receives why the watch broke. done is closed when the watch has
// stopped (after its context ends).
type fileChanges struct {
	changed <-chan struct{}
	failed  <-chan error
	done    <-chan struct{}
}

// watchFiles follows paths until ctx is done. The directories that exist
// are watched when it returns, so that a read after it misses no change.
//
// The watches are on the files' directories, not the files: Kubernetes
// swaps a "..data" symlink and editors write a temp file and rename it, and
// a watch on the old inode would see neither. Any event in a watched
// directory re-arms the debounce timer; the caller then reads the files and
// their content decides whether anything changed, so unrelated events in
// the directory cost a read and nothing else. A directory that does not
// exist yet (a volume not mounted yet) is tried again every second.
func (s *Service) watchFiles(ctx context.Context, paths ...string) (fileChanges, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fileChanges{}, fmt.Errorf("create file watcher: %w", err)
	}
	d := &dirFollower{s: s, w: w, dirs: uniqueDirs(paths...), watched: map[string]bool{}}
	var retry <-chan time.Time
	if err := d.addWatches(); err != nil {
		s.log.Warn("cannot watch certificate directory yet; retrying", "error", err)
		retry = s.clock.After(time.Second)
	}
	changed := make(chan struct{}, 1)
	failed := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer w.Close()
		if err := d.follow(ctx, retry, changed); err != nil {
			failed <- err
		}
	}()
	return fileChanges{changed: changed, failed: failed, done: done}, nil
}

// dirFollower is the state of one watch, owned by its goroutine once
// started.
type dirFollower struct {
	s       *Service
	w       *fsnotify.Watcher
	dirs    []string
	watched map[string]bool
}

// addWatches adds the directories not yet watched.
func (d *dirFollower) addWatches() error {
	var firstErr error
	for _, dir := range d.dirs {
		if d.watched[dir] {
			continue
		}
		if err := d.w.Add(dir); err != nil {
			d.s.m.watcherFailures.Inc()
			if firstErr == nil {
				firstErr = fmt.Errorf("watch directory %s: %w", dir, err)
			}
			continue
		}
		d.watched[dir] = true
	}
	return firstErr
}

func (d *dirFollower) follow(ctx context.Context, retry <-chan time.Time, changed chan<- struct{}) error {
	s := d.s
	signal := func() {
		select {
		case changed <- struct{}{}:
		default: // one pending signal is enough: the reader reads everything
		}
	}
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-d.w.Events:
			if !ok {
				return fmt.Errorf("file watcher closed")
			}
			s.log.Debug("certificate directory changed", "file", ev.Name, "op", ev.Op.String())
			debounce = s.clock.After(s.cfg.FileDebounce)
		case err, ok := <-d.w.Errors:
			if !ok {
				return fmt.Errorf("file watcher closed")
			}
			s.m.watcherFailures.Inc()
			s.log.Warn("file watcher error", "error", err)
			debounce = s.clock.After(s.cfg.FileDebounce) // events may have been lost: re-read
		case <-retry:
			retry = nil
			if err := d.addWatches(); err != nil {
				retry = s.clock.After(time.Second)
			} else {
				s.log.Info("watching certificate directories", "dirs", d.dirs)
			}
			signal()
		case <-debounce:
			debounce = nil
			signal()
		}
	}
}

func uniqueDirs(paths ...string) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range paths {
		d := filepath.Dir(p)
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}
