package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// initBinary is meshagent-init, built once for the tests: they run it as
// the image does, as a real process.
var initBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "meshagent-init-test-")
	if err != nil {
		panic(err)
	}
	initBinary = filepath.Join(dir, "meshagent-init")
	if out, err := exec.Command("go", "build", "-o", initBinary, ".").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		panic("building meshagent-init: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// exitCode is cmd's exit status; it fails the test if cmd did not run.
func exitCode(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatal(err)
	return 0
}

// Not PID 1 (a pod with shareProcessNamespace, a hand-run), the init
// replaces itself with the agent: the agent has the init's PID and parent,
// no process in between, and its exit status is the container's (#36).
func TestNotPID1ExecsTheAgent(t *testing.T) {
	cmd := exec.Command(initBinary, "/bin/sh", "agent-name", "-c", `echo "$$ $PPID $(tr '\0' '\n' </proc/$$/cmdline | head -1) $0"; exit 3`, "arg1")
	out, err := cmd.Output()
	if code := exitCode(t, err); code != 3 {
		t.Fatalf("exit %d, want the agent's 3 (%q)", code, out)
	}
	want := strconv.Itoa(cmd.Process.Pid) + " " + strconv.Itoa(os.Getpid()) + " agent-name arg1"
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("the agent says %q (pid ppid argv0 arg), want %q: the init's own process", got, want)
	}
}

// An agent that cannot be run is named, with a shell's exit codes.
func TestAgentMissingOrBad(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "pilot-agent")
	out, err := exec.Command(initBinary, missing, "pilot-agent").CombinedOutput()
	if code := exitCode(t, err); code != 127 || !strings.Contains(string(out), missing) {
		t.Fatalf("missing agent: exit %d %q, want 127 naming %s", code, out, missing)
	}
	notExec := filepath.Join(t.TempDir(), "pilot-agent")
	if err := os.WriteFile(notExec, []byte("not a program"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(initBinary, notExec, "pilot-agent").CombinedOutput()
	if code := exitCode(t, err); code != 126 || !strings.Contains(string(out), notExec) {
		t.Fatalf("agent not executable: exit %d %q, want 126 naming %s", code, out, notExec)
	}
	out, err = exec.Command(initBinary, "/bin/sh").CombinedOutput()
	if code := exitCode(t, err); code != 2 || !strings.Contains(string(out), "usage: meshagent-init AGENT ARGV0") {
		t.Fatalf("no ARGV0: exit %d %q, want 2 and the usage", code, out)
	}
}

// As PID 1 (the container's entrypoint) the init starts the agent as its
// child, passes its exit status through, and reaps an orphan re-parented to
// it: the agent (sh here) starts a sleep through a shell that exits at
// once, then waits until the sleep's PID is gone, a zombie until PID 1
// reaps it.
func TestPID1SupervisesAndReaps(t *testing.T) {
	testkit.RequireRoot(t, "to create a PID namespace", "unshare")
	script := `echo "$PPID $(tr '\0' '\n' </proc/$$/cmdline | head -1)"
p=$(sh -c 'sleep 0.1 </dev/null >/dev/null 2>&1 & echo $!')
i=0
while [ -e /proc/$p ] && [ $i -lt 1000 ]; do i=$((i+1)); sleep 0.02; done
if [ -e /proc/$p ]; then echo "orphan $p not reaped: $(cat /proc/$p/stat)"; exit 1; fi
echo reaped
exit 7`
	cmd := exec.Command("unshare", "--pid", "--fork", "--mount-proc", initBinary, "/bin/sh", "pilot-agent", "-c", script)
	out, err := cmd.CombinedOutput()
	if code := exitCode(t, err); code != 7 {
		t.Fatalf("exit %d, want the agent's 7:\n%s", code, out)
	}
	// The agent is the init's child, under the name given.
	if got := string(out); got != "1 pilot-agent\nreaped\n" {
		t.Fatalf("the agent says %q, want parent 1 and the name pilot-agent, then reaped", got)
	}
}
