package envoy

// Crash records (issue 22): when Envoy exits without being asked to, the
// agent keeps what an operator needs to say why, and what a kubelet restart
// would have lost: when, how it ended, how long it had run, the end of its
// stderr, the xDS versions it had ACKed and which bootstrap it ran. The last
// MaxCrashRecords are kept under the config path, readable on
// /debug/crashes; Istio's agent keeps nothing (Envoy's exit ends the pod's
// container and its logs go with the next restart's rotation).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshagent/meshagent/services/envoy/bootstrap"
	"github.com/meshagent/meshagent/services/internal/atomicfile"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
)

const (
	// MaxCrashRecords is how many crash records are kept; older ones are
	// removed when a new one is written.
	MaxCrashRecords = 5
	// StderrTailBytes is how much of the end of Envoy's stderr a record
	// keeps: Envoy's last words (an assertion, a bad-config error, the
	// backtrace of a crash) fit in it, a log flood does not grow it.
	StderrTailBytes = 64 << 10
	// MaxCrashRecordBytes bounds one record read back (#33: a 1 GiB sparse
	// file named as a record took the agent to 1.6 GB through
	// os.ReadFile). A record is StderrTailBytes of stderr, JSON-escaped
	// (at most six bytes a byte for control characters), and a few xDS
	// versions: under 400 KiB.
	MaxCrashRecordBytes = 1 << 20
	// crashPageSlots bounds the /debug/crashes requests served at once;
	// one more gets 503 at once. Each reads up to MaxCrashRecords records
	// of MaxCrashRecordBytes: two at once hold at most ~10 MiB, and an
	// operator looks at the page by hand.
	crashPageSlots = 2
	// crashFilePrefix names the records; the rest of the name is the UTC
	// time and the epoch, so that names sort by age.
	crashFilePrefix = "envoy-crash-"
)

// CrashRecord is one unexpected exit of Envoy, as kept on disk and served
// on /debug/crashes.
type CrashRecord struct {
	Time  time.Time `json:"time"`
	Epoch int       `json:"epoch"`
	PID   int       `json:"pid"`
	// ExitCode is Envoy's exit status, -1 when a signal ended it; Signal
	// names that signal ("killed", "segmentation fault").
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	Reason   string `json:"reason"`
	// Uptime is how long this Envoy had run.
	Uptime        string  `json:"uptime"`
	UptimeSeconds float64 `json:"uptime_seconds"`
	// ACKed is, per xDS type URL, the version Envoy had last ACKed through
	// the agent's XDS proxy (empty without one).
	ACKed map[string]string `json:"acked_versions,omitempty"`
	// BootstrapSHA256 identifies the bootstrap Envoy ran (empty for a
	// custom config file used as is).
	BootstrapSHA256 string `json:"bootstrap_sha256,omitempty"`
	// StderrTail is the end of Envoy's stderr, at most StderrTailBytes.
	StderrTail string `json:"stderr_tail"`
	// File is where the record is kept (set when written or read).
	File string `json:"file,omitempty"`
}

// newCrashRecord describes the exit of c.
func newCrashRecord(c *child, now time.Time, acked map[string]string, boot *bootstrap.Rendered) CrashRecord {
	code, reason := c.exitStatus()
	rec := CrashRecord{
		Time: now.UTC(), Epoch: c.epoch, PID: c.pid, ExitCode: code, Reason: reason,
		Uptime: now.Sub(c.started).Round(time.Millisecond).String(), UptimeSeconds: now.Sub(c.started).Seconds(),
		ACKed: acked, StderrTail: string(c.stderr.Bytes()),
	}
	if ps := c.cmd.ProcessState; ps != nil {
		if st, ok := ps.Sys().(syscall.WaitStatus); ok && st.Signaled() {
			rec.Signal = st.Signal().String()
		}
	}
	if boot != nil {
		rec.BootstrapSHA256 = boot.SHA256()
	}
	return rec
}

// writeCrashRecord keeps rec in dir (0700, created if missing) and removes
// all but the newest MaxCrashRecords. It returns the record's path.
func writeCrashRecord(dir string, rec CrashRecord) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("crash records: %w", err)
	}
	name := fmt.Sprintf("%s%s-epoch%d.json", crashFilePrefix, rec.Time.Format("20060102T150405.000000000Z"), rec.Epoch)
	path := filepath.Join(dir, name)
	rec.File = path
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return "", err
	}
	if err := atomicfile.Write(path, append(data, '\n'), 0o600); err != nil {
		return "", fmt.Errorf("crash record %s: %w", path, err)
	}
	names, err := crashFiles(dir)
	if err != nil {
		return path, err
	}
	var errs []error
	for len(names) > MaxCrashRecords {
		if err := os.Remove(filepath.Join(dir, names[0])); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		names = names[1:]
	}
	return path, errors.Join(errs...)
}

// crashFiles lists dir's crash records, oldest first.
func crashFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && strings.HasPrefix(e.Name(), crashFilePrefix) && strings.HasSuffix(e.Name(), ".json") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}

// ReadCrashRecords returns the newest MaxCrashRecords records kept in
// dir, newest first. A record that does not parse, or is not a regular
// file of at most MaxCrashRecordBytes (boundedfile), is skipped: the
// others still tell their story.
func ReadCrashRecords(dir string) ([]CrashRecord, error) {
	names, err := crashFiles(dir)
	if err != nil {
		return nil, err
	}
	if len(names) > MaxCrashRecords {
		names = names[len(names)-MaxCrashRecords:] // more were put there by hand
	}
	recs := make([]CrashRecord, 0, len(names))
	for _, name := range slices.Backward(names) {
		path := filepath.Join(dir, name)
		data, err := boundedfile.Read(path, MaxCrashRecordBytes)
		if err != nil {
			continue
		}
		var rec CrashRecord
		if json.Unmarshal(data, &rec) != nil {
			continue
		}
		rec.File = path
		recs = append(recs, rec)
	}
	return recs, nil
}

// CrashesHandler serves the records kept in dir on /debug/crashes: a JSON
// list, newest first (an empty list when Envoy never crashed). At most
// crashPageSlots requests are served at once; another gets 503.
func CrashesHandler(dir string) http.Handler {
	return crashesHandler(dir, make(chan struct{}, crashPageSlots))
}

func crashesHandler(dir string, slots chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, fmt.Sprintf("/debug/crashes: %d requests already served at once (the bound); try again", cap(slots)), http.StatusServiceUnavailable)
			return
		}
		recs, err := ReadCrashRecords(dir)
		if err != nil {
			http.Error(w, fmt.Sprintf("reading crash records in %s: %v", dir, err), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(recs)
	})
}

// tailBuffer keeps the last n bytes written to it. Envoy's stderr is copied
// into it by exec's copying goroutine while Serve's goroutine may read it.
type tailBuffer struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

func newTailBuffer(n int) *tailBuffer { return &tailBuffer{n: n} }

// Write keeps the end of p and of what came before, n bytes at most.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(p) >= t.n {
		t.buf = append(t.buf[:0], p[len(p)-t.n:]...)
		return len(p), nil
	}
	if over := len(t.buf) + len(p) - t.n; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return len(p), nil
}

// Bytes returns a copy of what is kept.
func (t *tailBuffer) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.buf)
}

// lastLine is the last non-empty line of Envoy's stderr, at most 512
// bytes: Envoy's reason for exiting (a bootstrap rule it refused, #36's
// build without the agent's own copy of Envoy's validators), for the exit's
// log line and health, beside the crash record that keeps the whole tail.
func (t *tailBuffer) lastLine() string {
	b := bytes.TrimRight(t.Bytes(), "\r\n\t ")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	if len(b) > 512 {
		b = append(b[:509:509], "..."...)
	}
	return strings.ToValidUTF8(string(b), "?")
}
