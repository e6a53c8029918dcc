package testkit

import (
	"os"
	"os/exec"
	"testing"
)

// A child that has exited is a zombie until it is waited for; a running
// process and a reaped one are not.
func TestIsZombie(t *testing.T) {
	if IsZombie(os.Getpid()) {
		t.Fatal("the test itself is a zombie")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	WaitFor(t, "true to exit", func() bool { return IsZombie(pid) })
	_ = cmd.Wait()
	if IsZombie(pid) {
		t.Fatal("a reaped process is a zombie")
	}
}
