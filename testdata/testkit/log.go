package testkit

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// LogBuffer collects what a service logs. Handlers write from many
// goroutines while the test reads, hence the lock. The zero value is
// ready to use.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// NewLogBuffer is a LogBuffer whose text is printed when t fails: the
// service's side of the story next to the failure.
func NewLogBuffer(t testing.TB) *LogBuffer {
	b := &LogBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", b)
		}
	})
	return b
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Len is how many bytes have been written so far: a mark for String()[mark:]
// without copying the log to take it.
func (b *LogBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Len()
}

// Logger is a debug-level text logger writing into b.
func (b *LogBuffer) Logger() *slog.Logger { return NewLogger(b) }

// WaitLine waits until one line of the log holds every one of parts.
func (b *LogBuffer) WaitLine(t testing.TB, parts ...string) {
	t.Helper()
	WaitFor(t, "a log line with "+strings.Join(parts, ", "), func() bool {
		for _, line := range strings.Split(b.String(), "\n") {
			if containsAll(line, parts) {
				return true
			}
		}
		return false
	})
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// NewLogger is a debug-level text logger writing to w.
func NewLogger(w interface{ Write([]byte) (int, error) }) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestLogger is a debug-level logger writing to t.Log, so that a service's
// log shows with the test's output (with -v, or when it fails). Lines
// logged after the test has ended are dropped: testing panics on a Log
// from a test that has completed.
func TestLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	return NewLogger(w)
}

type testWriter struct {
	t      testing.TB
	mu     sync.Mutex
	closed bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}
