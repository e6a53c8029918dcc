// Package nametable is the name-table file service (--name-table): it
// publishes the DNS name table read from a file, for tests and for running
// the DNS proxy without a control plane, and reloads it on change. The file
// is the protojson form of istio.networking.nds.v1.NameTable, as in
//
//	{"table": {"reviews.default.svc.cluster.local": {"ips": ["10.0.0.1"],
//	  "registry": "Kubernetes", "shortname": "reviews", "namespace": "default"}}}
//
// A bad file keeps the last good table and reports Degraded; a missing
// directory is waited for (services/internal/filewatch).
package nametable

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/messages/nds"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/services/internal/filewatch"
)

// Name is the service's name in logs, Health and /debug/tree.
const Name = "nametable"

// DefaultDebounce is how long the file's directory must be quiet before the
// file is read again: editors and atomic renames produce bursts of events.
const DefaultDebounce = 100 * time.Millisecond

// Config configures the name-table file service.
type Config struct {
	// File is the name-table file (--name-table).
	File string
	// Debounce is the quiet time before a changed file is read;
	// DefaultDebounce when 0.
	Debounce time.Duration
}

// Validate names the field and value that are wrong.
func (c Config) Validate() error {
	if c.File == "" {
		return errors.New("nametable config: File is required")
	}
	if c.Debounce < 0 {
		return fmt.Errorf("nametable config: Debounce %v must not be negative", c.Debounce)
	}
	return nil
}

// Inputs: the service reads no channel (the file is its source).
type Inputs struct{}

// Outputs are what the service publishes.
type Outputs struct {
	// Table: the name table, for the DNS proxy. Required.
	Table messages.Sink[messages.NameTable]
}

// Service publishes the name table read from a file.
type Service struct {
	cfg    Config
	out    Outputs
	health *messages.Reporter
	clock  messages.Clock
	log    *slog.Logger

	lastVersion string // survives restarts: the same file is not published twice
}

// New returns the service, or why cfg cannot work (the only check of cfg).
func New(cfg Config, _ Inputs, out Outputs, rt messages.Runtime) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if out.Table == nil {
		return nil, errors.New("nametable: Outputs.Table is required")
	}
	if cfg.Debounce == 0 {
		cfg.Debounce = DefaultDebounce
	}
	return &Service{cfg: cfg, out: out, health: rt.Health, clock: rt.Clock, log: rt.Log}, nil
}

// String is the service's name.
func (s *Service) String() string { return Name }

// Serve loads the file, then reloads it on every change of its directory
// until ctx is done. A directory that does not exist yet is waited for
// (Degraded meanwhile, naming the file), as a volume mounted late is.
func (s *Service) Serve(ctx context.Context) error {
	// The file's own events only (and a ..data swap): not a log's written
	// beside it (#32).
	w, err := filewatch.Start(filewatch.Options{Clock: s.clock, Log: s.log, Debounce: s.cfg.Debounce, Files: []string{s.cfg.File}},
		filewatch.DirsOf(s.cfg.File)...)
	if err != nil {
		return fmt.Errorf("name table file %s: %w", s.cfg.File, err)
	}
	defer w.Close()
	s.reload()
	for {
		select {
		case <-w.Changes():
			s.reload()
		case err := <-w.Failed():
			return fmt.Errorf("name table file %s: %w", s.cfg.File, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// reload reads and publishes the file if it changed; on error it keeps the
// last table and reports Degraded naming the file and the error.
func (s *Service) reload() {
	nt, err := ReadFile(s.cfg.File)
	if err != nil {
		s.log.Warn("name table file rejected, keeping the last table", "error", err)
		s.health.Report(messages.Degraded, err.Error())
		return
	}
	if nt.Version != s.lastVersion {
		s.out.Table.Send(nt)
		s.lastVersion = nt.Version
		s.log.Info("name table loaded", "file", s.cfg.File, "version", nt.Version, "hosts", len(nt.Hosts))
	}
	s.health.Report(messages.Ready, "")
}

// maxTableFile bounds the name-table file: protojson, about 200 bytes a
// host, so 64 MiB is some 300,000 hosts, past what one table holds (and
// the XDS proxy's cache, which keeps the NDS table, has the same default
// bound).
const maxTableFile = 64 << 20

// ReadFile reads a protojson NameTable file; its version is a hash of
// the content.
func ReadFile(path string) (messages.NameTable, error) {
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
