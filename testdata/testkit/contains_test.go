package testkit

import (
	"fmt"
	"testing"
)

// errorsTB keeps what a check reports instead of failing the test.
type errorsTB struct {
	testing.TB
	errs []string
}

func (e *errorsTB) Helper() {}
func (e *errorsTB) Errorf(format string, args ...any) {
	e.errs = append(e.errs, fmt.Sprintf(format, args...))
}

func TestContains(t *testing.T) {
	r := &errorsTB{TB: t}
	Contains(r, "text", "a b c", "a", "c")
	if len(r.errs) != 0 {
		t.Fatalf("reported %q", r.errs)
	}
	Contains(r, "text", "a b c", "x", "b", "y")
	if len(r.errs) != 2 || r.errs[0] != "text lacks \"x\":\na b c" || r.errs[1] != "text lacks \"y\":\na b c" {
		t.Fatalf("reported %q; want each missing part, with the text", r.errs)
	}
}
