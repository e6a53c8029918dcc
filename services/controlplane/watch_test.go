package controlplane

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// A mesh file with a YAML error, with the service's log written into the
// same directory: the warning is written once per content, not every
// debounce for ever (its own log write used to wake the watcher, #32).
func TestBadMeshFileWarnsOnceWithItsLogBesideIt(t *testing.T) {
	dir := t.TempDir()
	mesh, logPath := filepath.Join(dir, "mesh.yaml"), filepath.Join(dir, "agent.log")
	testkit.WriteFile(t, mesh, []byte("services: [unclosed\n"))
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	health := &testkit.HealthRecorder{}
	cfg := NewConfig("127.0.0.1:0", mesh)
	cfg.Debounce = 1e6 // 1 ms: a watcher woken by its own log would warn hundreds of times a second
	svc, err := New(cfg, Inputs{}, Outputs{}, messages.NewRuntime(Name, health, nil, nil, slog.New(slog.NewTextHandler(logFile, nil))))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, svc)
	health.WaitState(t, messages.Starting, mesh)

	warnings := func(of string) int {
		b, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "mesh file rejected") && strings.Contains(line, of) {
				n++
			}
		}
		return n
	}
	testkit.WaitFor(t, "the first warning", func() bool { return warnings("yaml: line 1:") > 0 })
	// Other files of the directory change too; then a second bad content:
	// once its warning is there, the first was written once.
	for range 10 {
		testkit.WriteFile(t, filepath.Join(dir, "other.txt"), []byte("x"))
	}
	testkit.ReplaceFile(t, mesh, []byte("services:\n  - name: a\n  - name: [b\n"))
	testkit.WaitFor(t, "the second warning", func() bool { return warnings("yaml: line 2:") > 0 })
	if n := warnings("yaml: line"); n != 2 {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("%d warnings, want one per content:\n%s", n, b)
	}
}
