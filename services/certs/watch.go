package certs

import (
	"github.com/meshagent/meshagent/services/internal/filewatch"
)

// watchFiles follows the directories of paths (services/internal/filewatch:
// directories, not files, for Kubernetes' ..data swaps and atomic renames; a
// directory not there yet, such as a volume mounted late, tried again on the
// clock). The directories that exist are watched when it returns, so that a
// read after it misses no change. Every failure to watch counts in Istio's
// num_file_watcher_failures_total.
func (s *Service) watchFiles(paths ...string) (*filewatch.Watcher, error) {
	return filewatch.Start(filewatch.Options{
		Clock:    s.clock,
		Log:      s.log,
		Debounce: s.cfg.FileDebounce,
		OnError:  func(error) { s.m.watcherFailures.Inc() },
	}, filewatch.DirsOf(paths...)...)
}
