package dnsproxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/messages/nds"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
)

// reloadDebounce is how long the file must be quiet before it is read
// again: editors and atomic renames produce bursts of events.
const reloadDebounce = 100 * time.Millisecond

// TableFile publishes the name table read from a file: the protojson form of
// istio.networking.nds.v1.NameTable, as in
//
//	{"table": {"reviews.default.svc.cluster.local": {"ips": ["10.0.0.1"],
//	  "registry": "Kubernetes", "shortname": "reviews", "namespace": "default"}}}
//
// For tests and for running the proxy without a control plane. It reloads on
// change; a bad file keeps the last good table and reports Degraded.
type TableFile struct {
	path   string
	out    messages.Sink[messages.NameTable]
	health *messages.Reporter
	clock  messages.Clock
	log    *slog.Logger

	lastVersion string // survives restarts: the same file is not published twice
}

// TableFileName is the table file service's name in logs, Health and
// /debug/tree.
const TableFileName = "nametable"

// NewTableFile returns the service that reads path into out.
func NewTableFile(path string, out messages.Sink[messages.NameTable], rt messages.Runtime) *TableFile {
	return &TableFile{path: path, out: out, health: rt.Health, clock: rt.Clock, log: rt.Log}
}

// String is the service's name.
func (f *TableFile) String() string { return TableFileName }

// Serve loads the file, then reloads it on every change until ctx is done.
func (f *TableFile) Serve(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("name table file %s: watch: %w", f.path, err)
	}
	defer w.Close()
	// The directory, not the file: an atomic rename replaces the file's
	// inode and a watch on the file would be lost.
	if err := w.Add(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("name table file %s: watch directory: %w", f.path, err)
	}
	f.reload()
	var debounce <-chan time.Time
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return fmt.Errorf("name table file %s: watcher closed", f.path)
			}
			if filepath.Clean(ev.Name) != filepath.Clean(f.path) {
				continue
			}
			debounce = f.clock.After(reloadDebounce)
		case err, ok := <-w.Errors:
			if !ok {
				return fmt.Errorf("name table file %s: watcher closed", f.path)
			}
			f.log.Warn("name table watch error", "file", f.path, "error", err)
		case <-debounce:
			debounce = nil
			f.reload()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// reload reads and publishes the file if it changed; on error it keeps the
// last table and reports Degraded naming the file and the error.
func (f *TableFile) reload() {
	nt, err := ReadTableFile(f.path)
	if err != nil {
		f.log.Warn("name table file rejected, keeping the last table", "error", err)
		f.health.Report(messages.Degraded, err.Error())
		return
	}
	if nt.Version != f.lastVersion {
		f.out.Send(nt)
		f.lastVersion = nt.Version
		f.log.Info("name table loaded", "file", f.path, "version", nt.Version, "hosts", len(nt.Hosts))
	}
	f.health.Report(messages.Ready, "")
}

// maxTableFile bounds the name-table file: protojson, about 200 bytes a
// host, so 64 MiB is some 300,000 hosts, past what one table holds (and
// the XDS proxy's cache, which keeps the NDS table, has the same default
// bound).
const maxTableFile = 64 << 20

// ReadTableFile reads a protojson NameTable file; its version is a hash of
// the content.
func ReadTableFile(path string) (messages.NameTable, error) {
	b, err := boundedfile.Read(path, maxTableFile)
	if err == nil {
		var nt messages.NameTable
		if nt, err = parseTable(b); err == nil {
			return nt, nil
		}
	}
	return messages.NameTable{}, fmt.Errorf("name table file %s: %w", path, err)
}

// parseTable parses a name-table file's content.
func parseTable(b []byte) (messages.NameTable, error) {
	var pb nds.NameTable
	if err := protojson.Unmarshal(b, &pb); err != nil {
		return messages.NameTable{}, err
	}
	sum := sha256.Sum256(b)
	return nds.ToMessage(&pb, "file-"+hex.EncodeToString(sum[:6]))
}
