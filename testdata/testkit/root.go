package testkit

import (
	"os"
	"os/exec"
	"testing"
)

// CanRoot says whether this process runs as root with every one of tools
// in PATH, as a test that makes namespaces, rules or children of another
// user needs; when not, it says what is missing. forWhat names what root
// is needed for, in that answer.
func CanRoot(forWhat string, tools ...string) (ok bool, missing string) {
	if os.Geteuid() != 0 {
		return false, "needs root (" + forWhat + ")"
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return false, "needs " + tool + " in PATH"
		}
	}
	return true, ""
}

// RequireRoot skips the test unless CanRoot.
func RequireRoot(t testing.TB, forWhat string, tools ...string) {
	t.Helper()
	if ok, missing := CanRoot(forWhat, tools...); !ok {
		t.Skip(missing)
	}
}
