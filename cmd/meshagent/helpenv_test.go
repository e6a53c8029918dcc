package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
)

// `meshagent help env` prints the table, sorted, one line a variable.
func TestHelpEnv(t *testing.T) {
	var out bytes.Buffer
	if code := execute(&cliContext{args: []string{"help", "env"}, host: config.Host{Env: config.MapEnvironment(nil)}, stdout: &out, stderr: &out}); code != 0 {
		t.Fatalf("help env: exit %d: %s", code, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(config.Vars())+1 {
		t.Errorf("help env: %d lines, want a header and %d variables", len(lines), len(config.Vars()))
	}
	for _, want := range []string{"PROV_CERT", "ISTIO_META_*", "localhost:15053"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help env lacks %q:\n%s", want, out.String())
		}
	}
}
