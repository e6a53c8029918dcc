package certs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/meshagent/meshagent/messages"
)

// serveFiles follows the file-mounted certificates.
//
// The watches are on the files' directories, not the files: Kubernetes
// swaps a "..data" symlink and editors write a temp file and rename it, and
// a watch on the old inode would see neither. Any event in a watched
// directory re-arms a debounce timer; when it fires the three files are read
// and checked together. The content hash decides whether anything changed,
// so unrelated events in the directory cost a read and nothing else.
func (s *Service) serveFiles(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("create file watcher: %w", err)
	}
	defer w.Close()

	dirs := uniqueDirs(s.cfg.CertChainFile, s.cfg.KeyFile, s.cfg.RootCertFile)
	watched := map[string]bool{}
	// addWatches adds the directories not yet watched; a directory that
	// does not exist yet (a volume not mounted yet) is retried by a timer.
	addWatches := func() error {
		var firstErr error
		for _, d := range dirs {
			if watched[d] {
				continue
			}
			if err := w.Add(d); err != nil {
				s.m.watcherFailures.Inc()
				if firstErr == nil {
					firstErr = fmt.Errorf("watch directory %s: %w", d, err)
				}
				continue
			}
			watched[d] = true
		}
		return firstErr
	}

	var retryWatch <-chan time.Time
	if err := addWatches(); err != nil {
		s.log.Warn("cannot watch certificate directory yet; retrying", "error", err)
		retryWatch = time.After(time.Second)
	}
	s.reload()

	debounce := time.NewTimer(0)
	if !debounce.Stop() {
		<-debounce.C
	}
	defer debounce.Stop()

	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-w.Events:
			if !ok {
				return fmt.Errorf("file watcher closed")
			}
			s.log.Debug("certificate directory changed", "file", ev.Name, "op", ev.Op.String())
			debounce.Reset(s.cfg.FileDebounce)
		case err, ok := <-w.Errors:
			if !ok {
				return fmt.Errorf("file watcher closed")
			}
			s.m.watcherFailures.Inc()
			s.log.Warn("file watcher error", "error", err)
			debounce.Reset(s.cfg.FileDebounce) // events may have been lost: re-read
		case <-retryWatch:
			retryWatch = nil
			if err := addWatches(); err != nil {
				retryWatch = time.After(time.Second)
			} else {
				s.log.Info("watching certificate directories", "dirs", dirs)
			}
			s.reload()
		case <-debounce.C:
			s.reload()
		}
	}
}

// reload reads and checks the files and publishes them if they changed. A bad
// set keeps the last good bundle and reports why.
func (s *Service) reload() {
	b, err := s.readFiles()
	if err != nil {
		s.m.fileFailures.Inc()
		if _, ok := s.last(); ok {
			s.log.Warn("rejected certificate update; still serving the last good certificate", "error", err)
			s.report(messages.Degraded, "rejected certificate update (serving the previous one): "+err.Error())
		} else {
			s.log.Warn("no usable certificate yet", "error", err)
			s.report(messages.Starting, "no usable certificate: "+err.Error())
		}
		return
	}
	if !s.publish(b) {
		s.log.Debug("certificate files unchanged", "version", b.Version)
	}
	s.report(messages.Ready, "")
}

func (s *Service) readFiles() (messages.CertBundle, error) {
	chain, err := os.ReadFile(s.cfg.CertChainFile)
	if err != nil {
		return messages.CertBundle{}, fmt.Errorf("read certificate chain: %w", err)
	}
	key, err := os.ReadFile(s.cfg.KeyFile)
	if err != nil {
		return messages.CertBundle{}, fmt.Errorf("read private key: %w", err)
	}
	roots, err := os.ReadFile(s.cfg.RootCertFile)
	if err != nil {
		return messages.CertBundle{}, fmt.Errorf("read root certificates: %w", err)
	}
	return buildBundle(chain, key, roots,
		bundleSources{s.cfg.CertChainFile, s.cfg.KeyFile, s.cfg.RootCertFile}, s.clock.Now())
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
