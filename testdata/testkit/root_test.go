package testkit

import (
	"os"
	"strings"
	"testing"
)

func TestCanRoot(t *testing.T) {
	ok, missing := CanRoot("a test", "sh")
	if root := os.Geteuid() == 0; ok != root || (!root && missing != "needs root (a test)") {
		t.Fatalf("CanRoot = %v, %q as uid %d", ok, missing, os.Geteuid())
	}
	if ok, missing := CanRoot("a test", "sh", "no-such-tool-anywhere"); ok || !strings.HasPrefix(missing, "needs ") {
		t.Fatalf("a missing tool: %v, %q", ok, missing)
	}
}
