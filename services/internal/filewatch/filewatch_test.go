package filewatch

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
)

const (
	debounce = 100 * time.Millisecond
	retry    = time.Second
)

// harness is a Watcher on a manual clock, with its log.
type harness struct {
	w     *Watcher
	clock *testkit.ManualClock
	logs  *testkit.LogBuffer
}

func start(t *testing.T, dirs ...string) *harness {
	t.Helper()
	return startFiles(t, nil, dirs...)
}

// startFiles is start with Options.Files.
func startFiles(t *testing.T, files []string, dirs ...string) *harness {
	t.Helper()
	h := &harness{clock: testkit.NewManualClock(), logs: testkit.NewLogBuffer(t)}
	w, err := Start(Options{Clock: h.clock, Log: h.logs.Logger(), Debounce: debounce, Retry: retry, Files: files}, dirs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	h.w = w
	return h
}

// next advances the clock each time the watcher waits on it, by enough to
// fire a debounce or a retry, until a change is delivered.
func (h *harness) next(t *testing.T) []string {
	t.Helper()
	deadline := time.NewTimer(testkit.Timeout)
	defer deadline.Stop()
	for {
		n, added := h.clock.Pending()
		if n > 0 {
			h.clock.Advance(DefaultMaxRetry) // whatever is due: a debounce, a retry however backed off
		}
		select {
		case dirs := <-h.w.Changes():
			return dirs
		case err := <-h.w.Failed():
			t.Fatalf("watch failed: %v", err)
		case <-added:
		case <-deadline.C:
			t.Fatal("no change delivered")
		}
	}
}

// none checks that nothing is delivered now. Only meaningful when the clock
// has not moved since the events: the watcher cannot deliver before it does.
func (h *harness) none(t *testing.T) {
	t.Helper()
	select {
	case dirs := <-h.w.Changes():
		t.Fatalf("change delivered early: %v", dirs)
	default:
	}
}

// seen waits until the watcher has taken the event op on file.
func (h *harness) seen(t *testing.T, file, op string) {
	t.Helper()
	h.logs.WaitLine(t, "watched directory changed", "file="+file, "op="+op)
}

// waitLog waits for a line holding every one of parts, logged after mark
// (a LogBuffer.Len taken before).
func (h *harness) waitLog(t *testing.T, mark int, parts ...string) {
	t.Helper()
	testkit.WaitFor(t, "a log line with "+strings.Join(parts, ", "), func() bool {
		for _, line := range strings.Split(h.logs.String()[mark:], "\n") {
			if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
				return true
			}
		}
		return false
	})
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func want(t *testing.T, got []string, dirs ...string) {
	t.Helper()
	if !slices.Equal(got, dirs) {
		t.Fatalf("changed = %v, want %v", got, dirs)
	}
}

// Several writes in a burst are one change, delivered only once the clock
// has moved past the debounce.
func TestDebounceCoalescesWrites(t *testing.T) {
	dir := t.TempDir()
	h := start(t, dir)
	for _, name := range []string{"a", "b", "c"} {
		write(t, filepath.Join(dir, name), name)
	}
	h.seen(t, filepath.Join(dir, "c"), "WRITE")
	h.none(t)
	want(t, h.next(t), dir)
	h.none(t)
	if n, _ := h.clock.Pending(); n != 0 {
		t.Errorf("%d timers still wait after the burst was delivered", n)
	}
}

// An editor's save: a temporary file renamed over the watched one.
func TestWriteAndRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mesh.yaml")
	write(t, path, "v1")
	h := start(t, dir)
	write(t, filepath.Join(dir, ".mesh.yaml.tmp"), "v2")
	if err := os.Rename(filepath.Join(dir, ".mesh.yaml.tmp"), path); err != nil {
		t.Fatal(err)
	}
	h.seen(t, path, "CREATE")
	want(t, h.next(t), dir)
}

// Kubernetes updates a ConfigMap or Secret volume by writing a new
// timestamped directory and renaming a "..data_tmp" symlink over "..data":
// the file's own path never changes, only what it resolves to.
func TestKubernetesDataSwap(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cert-chain.pem")
	testkit.ProjectVolume(t, dir, map[string][]byte{"cert-chain.pem": []byte("v1")})
	h := start(t, DirsOf(path)...)

	testkit.ProjectVolume(t, dir, map[string][]byte{"cert-chain.pem": []byte("v2")})
	h.seen(t, filepath.Join(dir, "..data"), "CREATE")
	want(t, h.next(t), dir)
	if b, err := os.ReadFile(path); err != nil || string(b) != "v2" {
		t.Fatalf("after the swap the file reads %q, %v", b, err)
	}
}

// A directory that does not exist yet is tried again on the clock and
// delivered when it appears; from then on its files are followed. One that
// is removed goes back to being tried again.
func TestDirectoryCreatedAfterStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	h := start(t, dir)
	h.none(t)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	want(t, h.next(t), dir) // on the retry, without an event
	h.logs.WaitLine(t, "watching directory", "dir="+dir)

	write(t, filepath.Join(dir, "key.pem"), "k")
	h.seen(t, filepath.Join(dir, "key.pem"), "WRITE")
	want(t, h.next(t), dir)

	// Removed: delivered (its files are gone), then tried again. The
	// waits on the log keep the steps in order: the removal taken, then
	// the directory made again.
	mark := h.logs.Len()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	h.waitLog(t, mark, "directory missing; retrying", "dir="+dir+" ")
	want(t, h.next(t), dir)
	mark = h.logs.Len() // before Mkdir: a retry already due may see it at once
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	want(t, h.next(t), dir)
	h.waitLog(t, mark, "watching directory", "dir="+dir)
	write(t, filepath.Join(dir, "cert.pem"), "c")
	h.seen(t, filepath.Join(dir, "cert.pem"), "WRITE")
	want(t, h.next(t), dir)
}

// Wants are counted: a directory stays watched until its last want is
// removed, and an unwatched directory's events are never delivered.
func TestAddRemoveCounted(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	h := start(t, a)
	h.w.Add(b)
	h.w.Add(b)
	h.w.Remove(b)
	write(t, filepath.Join(b, "f"), "1")
	h.seen(t, filepath.Join(b, "f"), "WRITE")
	want(t, h.next(t), b)

	h.w.Remove(b)
	write(t, filepath.Join(b, "g"), "2") // nobody watches b now
	write(t, filepath.Join(a, "f"), "3")
	// Events come in order: once a's is taken, b's would have been.
	h.seen(t, filepath.Join(a, "f"), "WRITE")
	want(t, h.next(t), a)
}

// With Files, only the named files (and a Kubernetes ..data swap) count:
// a log file written beside the mesh file wakes nothing, even when every
// read of the mesh file logs a warning into it (#32).
func TestFilesIgnoresOtherFilesOfTheDirectory(t *testing.T) {
	dir := t.TempDir()
	mesh, logFile := filepath.Join(dir, "mesh.yaml"), filepath.Join(dir, "agent.log")
	write(t, mesh, "v1")
	h := startFiles(t, []string{mesh}, DirsOf(mesh)...)
	for i := range 20 {
		write(t, logFile, strings.Repeat("warn\n", i+1))
	}
	write(t, mesh, "v2") // events come in order: the log's are taken before
	h.seen(t, mesh, "WRITE")
	want(t, h.next(t), dir)
	if strings.Contains(h.logs.String(), logFile) {
		t.Errorf("an event on %s was taken:\n%s", logFile, h.logs.String())
	}
	// One more log write after the delivery: no timer armed, nothing due.
	write(t, logFile, "warn again\n")
	write(t, filepath.Join(dir, "other"), "x")
	testkit.ProjectVolume(t, dir, map[string][]byte{"unrelated": []byte("v1")})
	h.seen(t, filepath.Join(dir, "..data"), "CREATE") // the swap still counts
	want(t, h.next(t), dir)
	if strings.Contains(h.logs.String(), "file="+filepath.Join(dir, "other")) {
		t.Errorf("an event on another file was taken:\n%s", h.logs.String())
	}
}

func TestDirsOf(t *testing.T) {
	want(t, DirsOf("/etc/certs/cert-chain.pem", "/etc/certs/key.pem", "/var/run/root.pem"), "/etc/certs", "/var/run")
}

// A directory that stays missing is tried at doubling intervals up to
// MaxRetry, not every Retry: the idle agent's CRL directory, which never
// comes without a plugged-in CA, woke it every second (#36). A directory
// that goes missing meanwhile is tried Retry after, the backoff starting
// over.
func TestMissingDirectoryBacksOff(t *testing.T) {
	clock := testkit.NewManualClock()
	tries := make(chan time.Time, 100)
	base := t.TempDir()
	w, err := Start(Options{Clock: clock, Debounce: debounce, Retry: time.Second, MaxRetry: 8 * time.Second,
		OnError: func(error) { tries <- clock.Now() }}, filepath.Join(base, "crl"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	try := func() time.Time {
		t.Helper()
		select {
		case at := <-tries:
			return at
		case <-time.After(testkit.Timeout):
			t.Fatal("no try")
			return time.Time{}
		}
	}
	last := try()
	var gaps []time.Duration
	for range 5 {
		clock.AdvanceToNext(t)
		at := try()
		gaps = append(gaps, at.Sub(last))
		last = at
	}
	if want := []time.Duration{1, 2, 4, 8, 8}; !slices.Equal(gaps, scale(want, time.Second)) {
		t.Errorf("retries after %v, want %v", gaps, scale(want, time.Second))
	}
	w.Add(filepath.Join(base, "other")) // missing too: tried at once, and again a Retry later
	last = try()
	clock.AdvanceToNext(t)
	try()
	if at := try(); at.Sub(last) != time.Second {
		t.Errorf("after a new missing directory, the next try came %v later, want 1s", at.Sub(last))
	}
}

func scale(ds []time.Duration, unit time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d * unit
	}
	return out
}
