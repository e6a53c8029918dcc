package testkit

import (
	"os"
	"testing"
)

// E2ESummaryEnv names the file an end-to-end suite appends its one-line
// outcome to; `make test` prints it after the tests, so a suite that skipped says so
// and why, where it used to be silent (#20).
const E2ESummaryEnv = "MESHAGENT_E2E_SUMMARY"

// E2ESummary appends, when the test is done, "suite: passed|FAILED|SKIPPED"
// and *detail (set by the test as it goes: a skip's reason, what ran) to the
// file E2ESummaryEnv names. Nothing without it.
func E2ESummary(t testing.TB, suite string, detail *string) {
	path := os.Getenv(E2ESummaryEnv)
	if path == "" {
		return
	}
	t.Cleanup(func() {
		line := suite + ": passed"
		switch {
		case t.Failed():
			line = suite + ": FAILED"
		case t.Skipped():
			line = suite + ": SKIPPED"
		}
		if *detail != "" {
			line += ": " + *detail
		}
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Errorf("%s: %v", E2ESummaryEnv, err)
			return
		}
		defer f.Close()
		if _, err := f.WriteString(line + "\n"); err != nil {
			t.Errorf("%s: %v", E2ESummaryEnv, err)
		}
	})
}
