package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

func TestStandaloneTokenKeepsAnExistingOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "var/run/secrets/tokens/istio-token")
	if err := writeStandaloneToken(path); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, path, []byte("the user's token"))
	if err := writeStandaloneToken(path); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != "the user's token" {
		t.Errorf("token = %q, %v; want the existing one kept", got, err)
	}
	if err := writeStandaloneToken(filepath.Join(path, "under-a-file")); err == nil {
		t.Error("a token path under a file: no error")
	}
}

// The configuration refuses a standalone run without --mesh
// (config.TestStandaloneMeshIsRequired); the command makes that a usage
// error, exit 2, naming the flag.
func TestStandaloneWithoutMeshIsAUsageError(t *testing.T) {
	if code, _, stderr := runCLI("standalone", "--root", t.TempDir()); code != 2 || !strings.Contains(stderr, "--mesh") {
		t.Errorf("meshagent standalone without --mesh: exit %d, %q; want 2 naming --mesh", code, stderr)
	}
}
