// Package filewatch is the one way a service follows files it reads (the
// certs service's mounted certificates, SDS's file secrets and CRL, the
// name-table file, the control plane's mesh file): fsnotify on the files'
// directories, a debounce on the runtime's clock, and one behaviour for a
// directory that is missing (#26; the four hand-written loops it replaces
// disagreed on that).
//
// Directories, not files, are watched: Kubernetes swaps a "..data" symlink
// and editors write a temporary file and rename it over the old one, and a
// watch on the old inode would see neither. Any event in a watched directory
// counts, unless Options.Files names the files the owner reads: then only
// events on those names (and on Kubernetes's "..data" entries) do. The
// owner then reads its files, and their content decides whether anything
// changed, so an unrelated event costs a read; but an owner that logs a
// warning per bad read, with its log written into the same directory, would
// otherwise wake itself for ever (#32).
//
// A directory that does not exist (a volume not mounted yet, a ConfigMap
// not projected yet, a CRL directory a plugged-in CA has not created) is
// tried again on the runtime's clock, after Options.Retry and then at
// doubling intervals up to Options.MaxRetry, and so is a watched directory
// that is removed or renamed away. Once it can be watched it is delivered
// at once, without the debounce: its files were written while nobody could
// watch them. We poll rather than watch the nearest existing parent: a try
// per missing directory is cheap, needs no bookkeeping of ancestors, and
// also sees a directory that appears when a file system is mounted over one
// of its parents, which tells no watch. The backoff is for the idle agent:
// a directory that never comes (a pod with no plugged-in CA has no CRL
// directory, ever) tried every second woke the agent every second, 0.8 of
// its 1.1 CPU seconds an hour at idle (#36).
package filewatch

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/meshagent/meshagent/messages"
)

// DefaultRetry is how soon a missing directory is tried again, and
// DefaultMaxRetry the longest interval the tries back off to.
const (
	DefaultRetry    = time.Second
	DefaultMaxRetry = 16 * time.Second
)

// ErrClosed: fsnotify closed its channels under a running watch.
var ErrClosed = errors.New("file watcher closed")

// Options configure a Watcher.
type Options struct {
	// Clock times the debounce and the retries: the service's runtime
	// clock, so that tests drive both.
	Clock messages.Clock
	// Log gets a debug line per event and a warning per watcher error;
	// nil discards.
	Log *slog.Logger
	// Debounce is the quiet time after the last event in a directory
	// before the directory is delivered: editors and atomic renames make
	// bursts of events.
	Debounce time.Duration
	// Retry is how soon missing directories are tried again, each failed
	// try doubling the interval up to MaxRetry; DefaultRetry and
	// DefaultMaxRetry when 0.
	Retry, MaxRetry time.Duration
	// Files, if set, are the only files whose events count in their
	// directories (besides Kubernetes's atomic-writer entries, "..data" and
	// its temporaries, whose swap replaces every file of a mounted volume).
	// Events on other files of those directories are ignored. Directories
	// added without a file of theirs in Files still count every event.
	Files []string
	// OnError, if set, is called on every failure to watch a directory and
	// every error fsnotify reports: the certs service counts them as
	// Istio's num_file_watcher_failures_total.
	OnError func(error)
}

// Watcher follows a set of directories. Its state is owned by one goroutine,
// started by Start and ended by Close; Add and Remove are messages to it.
type Watcher struct {
	opts    Options
	fs      *fsnotify.Watcher
	reqs    chan request
	changes chan []string
	failed  chan error
	stop    chan struct{}
	done    chan struct{}

	// Owned by the loop (by Start before it runs).
	refs    map[string]int             // wanted directories, counted
	files   map[string]map[string]bool // Options.Files: base names by directory
	missing map[string]bool            // wanted but not watched yet
	retry   <-chan time.Time
	// backoff is the interval of the next retry: Options.Retry when a
	// directory goes missing, doubled by each try that finds one missing.
	backoff time.Duration
}

type request struct {
	add, remove []string
	applied     chan struct{}
}

// Start watches dirs and returns once those that exist are watched, so that
// a read of their files after Start misses no later change. Close stops it.
func Start(opts Options, dirs ...string) (*Watcher, error) {
	if opts.Clock == nil {
		opts.Clock = messages.SystemClock{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Retry <= 0 {
		opts.Retry = DefaultRetry
	}
	if opts.MaxRetry <= 0 {
		opts.MaxRetry = max(DefaultMaxRetry, opts.Retry)
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("create file watcher: %w", err)
	}
	w := &Watcher{
		opts: opts, fs: fsw,
		reqs:    make(chan request),
		changes: make(chan []string),
		failed:  make(chan error, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		refs:    map[string]int{},
		missing: map[string]bool{},
		files:   map[string]map[string]bool{},
	}
	for _, f := range opts.Files {
		dir, name := filepath.Split(filepath.Clean(f))
		dir = filepath.Clean(dir)
		if w.files[dir] == nil {
			w.files[dir] = map[string]bool{}
		}
		w.files[dir][name] = true
	}
	w.add(dirs)
	go w.run()
	return w, nil
}

// Changes receives the directories that changed (sorted), once each has been
// quiet for Options.Debounce, or has appeared. Directories that change while
// the owner is busy are gathered into the next receive.
func (w *Watcher) Changes() <-chan []string { return w.changes }

// Failed receives once if the watch breaks (ErrClosed); the owner should
// return the error, and be restarted.
func (w *Watcher) Failed() <-chan error { return w.failed }

// Add wants dirs watched (each want counted) and returns once those that
// exist are.
func (w *Watcher) Add(dirs ...string) { w.send(request{add: dirs}) }

// Remove drops one want of each of dirs; a directory nobody wants is no
// longer watched.
func (w *Watcher) Remove(dirs ...string) { w.send(request{remove: dirs}) }

func (w *Watcher) send(r request) {
	r.applied = make(chan struct{})
	select {
	case w.reqs <- r:
		<-r.applied
	case <-w.done:
	}
}

// Close stops the watch and returns once its goroutine has.
func (w *Watcher) Close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

func (w *Watcher) run() {
	defer close(w.done)
	defer w.fs.Close()
	pending := map[string]bool{} // changed, waiting for the debounce
	ready := map[string]bool{}   // to deliver
	var debounce <-chan time.Time
	for {
		var out chan<- []string
		var batch []string
		if len(ready) > 0 {
			out, batch = w.changes, sorted(ready)
		}
		select {
		case <-w.stop:
			return
		case out <- batch:
			clear(ready)
		case r := <-w.reqs:
			w.add(r.add)
			for _, dir := range w.remove(r.remove) {
				delete(pending, dir)
				delete(ready, dir)
			}
			close(r.applied)
		case ev, ok := <-w.fs.Events:
			if !ok {
				w.failed <- ErrClosed
				return
			}
			dirs := w.affected(ev)
			if len(dirs) == 0 {
				// Not even a debug line: it would be written into the
				// directory of a log file, and wake this loop again.
				continue
			}
			w.opts.Log.Debug("watched directory changed", "file", ev.Name, "op", ev.Op.String())
			for _, dir := range dirs {
				pending[dir] = true
			}
			debounce = w.opts.Clock.After(w.opts.Debounce)
		case err, ok := <-w.fs.Errors:
			if !ok {
				w.failed <- ErrClosed
				return
			}
			// Events may have been lost (an overflowed queue): every
			// directory is read again.
			w.opts.Log.Warn("file watcher error; reading every watched directory again", "error", err)
			w.onError(err)
			for dir := range w.refs {
				if !w.missing[dir] {
					pending[dir] = true
				}
			}
			debounce = w.opts.Clock.After(w.opts.Debounce)
		case <-w.retry:
			w.retry = nil
			w.backoff = min(2*w.backoff, w.opts.MaxRetry)
			for _, dir := range w.retryMissing() {
				ready[dir] = true
			}
		case <-debounce:
			debounce = nil
			for dir := range pending {
				ready[dir] = true
			}
			clear(pending)
		}
	}
}

// add counts a want of each of dirs and watches those wanted for the first
// time.
func (w *Watcher) add(dirs []string) {
	for _, dir := range dirs {
		dir = filepath.Clean(dir)
		if w.refs[dir]++; w.refs[dir] == 1 {
			w.watch(dir)
		}
	}
}

// remove drops a want of each of dirs and returns those nobody wants now.
func (w *Watcher) remove(dirs []string) []string {
	var gone []string
	for _, dir := range dirs {
		dir = filepath.Clean(dir)
		if w.refs[dir] == 0 {
			continue
		}
		if w.refs[dir]--; w.refs[dir] > 0 {
			continue
		}
		delete(w.refs, dir)
		gone = append(gone, dir)
		if w.missing[dir] {
			delete(w.missing, dir)
			continue
		}
		_ = w.fs.Remove(dir) // fails only if the directory is gone already
	}
	return gone
}

// watch adds dir's watch, or marks it missing and arms the retry.
func (w *Watcher) watch(dir string) {
	if err := w.fs.Add(dir); err != nil {
		w.opts.Log.Debug("cannot watch directory", "dir", dir, "error", err)
		w.onError(fmt.Errorf("watch directory %s: %w", dir, err))
		w.markMissing(dir)
	}
}

// markMissing: dir is tried again, Options.Retry from now when it has just
// gone missing (a retry already due later is brought forward).
func (w *Watcher) markMissing(dir string) {
	w.missing[dir] = true
	if w.retry == nil || w.backoff > w.opts.Retry {
		w.backoff = w.opts.Retry
		w.retry = w.opts.Clock.After(w.backoff)
	}
	w.opts.Log.Debug("directory missing; retrying", "dir", dir, "first", w.opts.Retry, "upTo", w.opts.MaxRetry)
}

// retryMissing tries the missing directories again and returns those it now
// watches; those still missing are tried again after the backed-off
// interval.
func (w *Watcher) retryMissing() []string {
	var now []string
	dirs := slices.Collect(maps.Keys(w.missing))
	clear(w.missing)
	for _, dir := range dirs {
		if err := w.fs.Add(dir); err != nil {
			w.onError(fmt.Errorf("watch directory %s: %w", dir, err))
			w.missing[dir] = true
			continue
		}
		w.opts.Log.Info("watching directory", "dir", dir)
		now = append(now, dir)
	}
	if len(w.missing) > 0 {
		w.retry = w.opts.Clock.After(w.backoff)
	}
	return now
}

// affected returns the watched directories an event concerns: the one the
// file is in, and the directory itself when it was removed or renamed away
// (which ends its watch: it is tried again until it is back).
func (w *Watcher) affected(ev fsnotify.Event) []string {
	var out []string
	if dir := filepath.Dir(ev.Name); w.refs[dir] > 0 && w.counts(dir, filepath.Base(ev.Name)) {
		out = append(out, dir)
	}
	if name := filepath.Clean(ev.Name); w.refs[name] > 0 && !w.missing[name] && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) {
		out = append(out, name)
		_ = w.fs.Remove(name)
		w.markMissing(name)
	}
	return out
}

// counts says whether an event on file name in dir concerns the owner.
func (w *Watcher) counts(dir, name string) bool {
	names, filtered := w.files[dir]
	return !filtered || names[name] || strings.HasPrefix(name, "..")
}

func (w *Watcher) onError(err error) {
	if w.opts.OnError != nil {
		w.opts.OnError(err)
	}
}

func sorted(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for dir := range set {
		out = append(out, dir)
	}
	slices.Sort(out)
	return out
}

// DirsOf returns the directories of files, each once, in order.
func DirsOf(files ...string) []string {
	var out []string
	for _, f := range files {
		if dir := filepath.Dir(f); !slices.Contains(out, dir) {
			out = append(out, dir)
		}
	}
	return out
}
