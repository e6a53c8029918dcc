package envoy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
)

// An Envoy that crashes leaves a record: how it ended, how long it ran, the
// end of its stderr, the bootstrap it ran; /debug/crashes serves it, and
// the service's health names the file (issue 22).
func TestCrashLeavesARecord(t *testing.T) {
	crashDir := filepath.Join(t.TempDir(), "envoy-crashes")
	h := newHarness(t, []string{"FAKE_ENVOY_CRASH_AFTER=300ms", "FAKE_ENVOY_EXIT_CODE=7"},
		func(c *Config) { c.CrashDir = crashDir })
	err := h.waitServe(h.serve(context.Background()))
	if !errors.Is(err, ErrEnvoyExited) {
		t.Fatalf("Serve = %v; want ErrEnvoyExited", err)
	}
	recs, err := ReadCrashRecords(crashDir)
	if err != nil || len(recs) != 1 {
		t.Fatalf("ReadCrashRecords = %d records, %v; want 1", len(recs), err)
	}
	rec := recs[0]
	if rec.ExitCode != 7 || rec.Signal != "" || rec.Reason != "exit status 7" {
		t.Errorf("record exit = %d %q %q; want 7, no signal, exit status 7", rec.ExitCode, rec.Signal, rec.Reason)
	}
	// The stand-in's last words, as Envoy's would be.
	if !strings.Contains(rec.StderrTail, "crashing with exit code 7") {
		t.Errorf("stderr tail %q lacks Envoy's last line", rec.StderrTail)
	}
	if rec.UptimeSeconds <= 0 || rec.PID == 0 {
		t.Errorf("record uptime %v, pid %d", rec.UptimeSeconds, rec.PID)
	}
	// Envoy's reason is said where a user looks first: the health
	// (/debug/tree) and the exit's log line.
	if !h.sawHealth(messages.Failed, "its last line: ") || !h.sawHealth(messages.Failed, "crashing with exit code 7") {
		t.Errorf("health does not carry Envoy's last line: %+v", h.health.All())
	}
	if !h.sawHealth(messages.Failed, "crash record "+rec.File) {
		t.Errorf("health does not name the record %s: %+v", rec.File, h.health.All())
	}
	if fi, err := os.Stat(rec.File); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("record file %s: %v, mode %v; want 0600", rec.File, err, fi.Mode())
	}
	// The stderr Envoy writes still reaches the agent's own stderr.
	if !strings.Contains(h.stderr.String(), "crashing with exit code 7") {
		t.Errorf("Envoy's stderr no longer reaches Config.Stderr")
	}

	w := httptest.NewRecorder()
	CrashesHandler(crashDir).ServeHTTP(w, httptest.NewRequest("GET", "/debug/crashes", nil))
	var served []CrashRecord
	if err := json.Unmarshal(w.Body.Bytes(), &served); err != nil || len(served) != 1 || served[0].PID != rec.PID {
		t.Fatalf("/debug/crashes = %s (%v); want the one record", w.Body, err)
	}
}

// A SIGKILLed Envoy (the OOM killer's way) is recorded with its signal; a
// drained one (a stop asked for) leaves no record.
func TestCrashRecordNamesTheSignalAndDrainsLeaveNone(t *testing.T) {
	crashDir := t.TempDir()
	h := newHarness(t, nil, func(c *Config) { c.CrashDir = crashDir })
	errc := h.serve(context.Background())
	h.killWhen("ready", ready)
	if err := h.waitServe(errc); !errors.Is(err, ErrEnvoyExited) {
		t.Fatalf("Serve = %v; want ErrEnvoyExited", err)
	}
	recs, _ := ReadCrashRecords(crashDir)
	if len(recs) != 1 || recs[0].Signal != "killed" || recs[0].ExitCode != -1 {
		t.Fatalf("records = %+v; want one with signal killed", recs)
	}
	if err := h.drainToExit(); !errors.Is(err, ErrDrained) {
		t.Fatalf("drain: Serve = %v", err)
	}
	if recs, _ := ReadCrashRecords(crashDir); len(recs) != 1 {
		t.Fatalf("a drained Envoy left a record: %d records", len(recs))
	}
}

// Only the newest MaxCrashRecords are kept, newest first.
func TestCrashRecordsKeepTheNewestFive(t *testing.T) {
	dir := t.TempDir()
	start := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	for i := range MaxCrashRecords + 3 {
		if _, err := writeCrashRecord(dir, CrashRecord{Time: start.Add(time.Duration(i) * time.Second), Epoch: i}); err != nil {
			t.Fatal(err)
		}
	}
	// Not a record: left alone.
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadCrashRecords(dir)
	if err != nil {
		t.Fatal(err)
	}
	var epochs []int
	for _, r := range recs {
		epochs = append(epochs, r.Epoch)
	}
	if fmt.Sprint(epochs) != "[7 6 5 4 3]" {
		t.Fatalf("kept epochs %v; want the newest five, newest first", epochs)
	}
	if _, err := os.Stat(filepath.Join(dir, "notes.txt")); err != nil {
		t.Fatalf("pruning removed a file that is not a record: %v", err)
	}
}

// The tail keeps the last n bytes whatever the sizes of the writes.
func TestTailBufferKeepsTheEnd(t *testing.T) {
	var all bytes.Buffer
	tail := newTailBuffer(10)
	for _, w := range []string{"abc", "defghij", "k", "lmnopqrstuvwxyz0123", "45"} {
		all.WriteString(w)
		if _, err := tail.Write([]byte(w)); err != nil {
			t.Fatal(err)
		}
		want := all.Bytes()[max(0, all.Len()-10):]
		if got := tail.Bytes(); !bytes.Equal(got, want) {
			t.Fatalf("after %q: tail %q; want %q", w, got, want)
		}
	}
}

// A huge file named as a record (#33: a 1 GiB sparse envoy-crash-*.json
// and three concurrent GETs took the agent to 1.6 GB) is skipped without
// being read: the page still lists the real records, and what the GETs
// allocate stays far below the file's size.
func TestCrashesPageSkipsAHugeRecord(t *testing.T) {
	dir := t.TempDir()
	start := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	for i := range 2 {
		if _, err := writeCrashRecord(dir, CrashRecord{Time: start.Add(time.Duration(i) * time.Second), Epoch: i}); err != nil {
			t.Fatal(err)
		}
	}
	const huge = 256 << 20
	f, err := os.Create(filepath.Join(dir, crashFilePrefix+"99999999T999999.999999999Z-epoch9.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(huge); err != nil { // sparse: no disk, all zeros
		t.Fatal(err)
	}
	f.Close()

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	h := CrashesHandler(dir)
	var wg sync.WaitGroup
	bodies := make([]string, crashPageSlots)
	for i := range bodies {
		wg.Go(func() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", "/debug/crashes", nil))
			bodies[i] = fmt.Sprint(w.Code, " ", w.Body.String())
		})
	}
	wg.Wait()
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > huge/4 {
		t.Errorf("%d GETs allocated %d MiB with a %d MiB file named as a record", len(bodies), alloc>>20, huge>>20)
	}
	for _, b := range bodies {
		if !strings.HasPrefix(b, "200 ") || strings.Count(b, `"epoch"`) != 2 {
			t.Errorf("/debug/crashes = %.300s; want the two real records", b)
		}
	}
}

// Requests past the bound get 503 at once, not a share of memory.
func TestCrashesPageBoundsConcurrentRequests(t *testing.T) {
	slots := make(chan struct{}, crashPageSlots)
	for range crashPageSlots {
		slots <- struct{}{} // every slot taken
	}
	w := httptest.NewRecorder()
	crashesHandler(t.TempDir(), slots).ServeHTTP(w, httptest.NewRequest("GET", "/debug/crashes", nil))
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "the bound") {
		t.Fatalf("with every slot taken: %d %q; want 503 naming the bound", w.Code, w.Body.String())
	}
	<-slots
	w = httptest.NewRecorder()
	crashesHandler(t.TempDir(), slots).ServeHTTP(w, httptest.NewRequest("GET", "/debug/crashes", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("with a slot free: %d %q", w.Code, w.Body.String())
	}
}
