package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// On a VM a package upgrade puts a new Envoy binary in place (a new file
// renamed over the old one, as dpkg does). With MESHAGENT_HOT_RESTART=true
// the agent picks it up by a hot restart (#25): a client dialling Envoy's
// Prometheus listener without pause, inside the VM's network namespace, is
// never refused; the new epoch runs the new file, as 1337; SIGTERM then
// stops the agent and every Envoy.
func TestVMHotRestartOnNewEnvoyBinary(t *testing.T) {
	vm := startVM(t, "MESHAGENT_HOT_RESTART=true")
	// Envoy leaves its hot restart shared memory behind (Envoy's own
	// behaviour); the test's goes with the test.
	base := config.HotRestartBaseID(config.Rooted(vm.root, "etc/istio/proxy"))
	testkit.CleanupEnvoySharedMemory(t, base)
	e2ekit.AwaitNotify(t, vm.notify, "READY=1", vm.p, vm.ns)
	first := envoysRunning(t, vm)
	if len(first) != 1 {
		t.Fatalf("Envoys running %v, want one", first)
	}

	d := testkit.StartDialerIn(t, vm.ns, "127.0.0.1:15090")
	defer d.Stop()
	bin, err := os.ReadFile(vm.envoyCopy)
	if err != nil {
		t.Fatal(err)
	}
	// Another build: the same program with a byte more (an ELF file's
	// loader ignores what follows its sections); the content hash differs.
	next := vm.envoyCopy + ".dpkg-new"
	testkit.WriteFile(t, next, append(bin, '\n'))
	if err := os.Chmod(next, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, vm.envoyCopy); err != nil {
		t.Fatal(err)
	}
	vm.p.WaitLog(t, "the takeover", func(log string) bool {
		return strings.Contains(log, "hot restart: the new epoch took over") && strings.Contains(log, `reason="changed: `+vm.envoyCopy)
	})
	d.Stop()
	if accepted, refused, other := d.Counts(); refused != 0 || accepted == 0 {
		t.Fatalf("across the hot restart: %d connections accepted, %d refused, %d other errors (%s)", accepted, refused, other, d.LastError())
	} else {
		t.Logf("across the hot restart onto the new binary: %d connections accepted, none refused", accepted)
	}
	// The old epoch runs the replaced file; the new one, the new file.
	var newPID int
	testkit.WaitFor(t, "an Envoy of the new binary", func() bool {
		for pid, exe := range envoysRunning(t, vm) {
			if exe == vm.envoyCopy && pid != keyOf(first) {
				newPID = pid
				return true
			}
		}
		return false
	})
	if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", newPID)); !strings.Contains(string(cmdline), "--restart-epoch\x001\x00") {
		t.Errorf("the new Envoy's command line %q, want --restart-epoch 1", strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	if uids, gids := e2ekit.ProcIDs(t, newPID); uids != "1337 1337" || gids != "1337 1337" {
		t.Errorf("the new Envoy runs as uid %q gid %q, want 1337 for both", uids, gids)
	}

	if err := vm.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := vm.p.WaitExit(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM during the overlap, want 0", code)
	}
	for pid := range first {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil && !testkit.IsZombie(pid) {
			t.Errorf("epoch 0 (pid %d) still runs after the agent stopped", pid)
		}
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", newPID)); err == nil && !testkit.IsZombie(newPID) {
		t.Errorf("epoch 1 (pid %d) still runs after the agent stopped", newPID)
	}
}

// envoysRunning are the agent's Envoy children: pid → executable (a
// replaced file reads "... (deleted)").
func envoysRunning(t *testing.T, vm *vmAgent) map[int]string {
	t.Helper()
	out := map[int]string{}
	for _, pid := range e2ekit.ChildPIDs(t, vm.cmd.Process.Pid) {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if strings.HasPrefix(exe, filepath.Dir(vm.envoyCopy)+"/") {
			out[pid] = exe
		}
	}
	return out
}

// keyOf is the one key of m.
func keyOf(m map[int]string) int {
	for k := range m {
		return k
	}
	return 0
}
