package main

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// podNetns starts a process holding a fresh network namespace (a pod, for
// the CNI case) and returns its namespace file; the process ends with t.
func podNetns(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("unshare", "-n", "sh", "-c", "ip link set lo up && echo ready && exec sleep 600")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("namespace holder: %q", line)
	}
	return "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net"
}

func nsRun(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nsenter %s %v: %v: %s", ns, args, err, out)
	}
	return string(out)
}

// TestIstioIptablesNetworkNamespace is the CNI plugin's call: from the
// host side, --network-namespace programs a pod's namespace, with either
// backend, and leaves the host's untouched; a second call for the same pod
// waits for the first one's lock (#23).
func TestIstioIptablesNetworkNamespace(t *testing.T) {
	testkit.RequireRoot(t, "enters network namespaces", "unshare", "nsenter", "ip", "nft", "iptables-save")
	// "The host" is a namespace of this test's own: this goroutine's thread
	// is moved into it and never unlocked (the runtime discards it), so
	// whatever the CLI did to its own namespace would show here, not on the
	// real host.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Fatal(err)
	}
	self := func() string {
		l, _ := os.Readlink("/proc/thread-self/ns/net")
		return l
	}
	home := self()
	args := []string{"-i", "*", "-b", "*", "-d", "15020,15021,15090"}

	nftPod := podNetns(t)
	code, _, errOut := runIptables(t, nil, "ipv4", nil, append([]string{"istio-iptables", "--network-namespace", nftPod, "--native-nftables", "--cni-mode"}, args...)...)
	if code != 0 || !strings.Contains(errOut, "backend=nftables") {
		t.Fatalf("nft into the pod: exit %d: %s", code, errOut)
	}
	if got := nsRun(t, nftPod, "nft", "-s", "list", "ruleset"); !strings.Contains(got, "table inet istio-proxy-nat") {
		t.Errorf("the pod's namespace holds no capture tables:\n%s", got)
	}

	iptPod := podNetns(t)
	code, _, errOut = runIptables(t, nil, "ipv4", nil, append([]string{"istio-iptables", "--network-namespace", iptPod}, args...)...)
	if code != 0 {
		t.Fatalf("iptables into the pod: exit %d: %s", code, errOut)
	}
	if got := nsRun(t, iptPod, "iptables-save", "-t", "nat"); !strings.Contains(got, ":ISTIO_OUTPUT") {
		t.Errorf("the pod's namespace holds no ISTIO_ chains:\n%s", got)
	}

	if self() != home {
		t.Fatalf("the thread did not come back: in %s, was in %s", self(), home)
	}
	if out, _ := exec.Command("nft", "list", "ruleset").CombinedOutput(); strings.TrimSpace(string(out)) != "" {
		t.Errorf("the host's namespace got nft rules:\n%s", out)
	}
	if out, _ := exec.Command("iptables-save").CombinedOutput(); strings.Contains(string(out), "ISTIO_") {
		t.Errorf("the host's namespace got iptables rules:\n%s", out)
	}

	// The lock: while another step holds the pod's, a call waits, applies
	// nothing, and goes on once it is released.
	lockedPod := podNetns(t)
	f, err := os.Open(lockedPod)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	stderr := testkit.NewLogBuffer(t)
	done := make(chan int)
	go func() {
		host := iptablesHost(t, nil, "ipv4", nil)
		cli := &cliContext{args: append([]string{"istio-iptables", "--network-namespace", lockedPod, "--native-nftables"}, args...),
			host: host, stdout: stderr, stderr: stderr}
		done <- execute(cli)
	}()
	stderr.WaitLine(t, "waiting for the network namespace's lock", lockedPod)
	if got := nsRun(t, lockedPod, "nft", "list", "ruleset"); strings.TrimSpace(got) != "" {
		t.Errorf("applied while another step held the lock:\n%s", got)
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	if code := <-done; code != 0 {
		t.Fatalf("after the lock was released: exit %d: %s", code, stderr)
	}
	if got := nsRun(t, lockedPod, "nft", "-s", "list", "ruleset"); !strings.Contains(got, "table inet istio-proxy-nat") {
		t.Errorf("after the lock was released, no capture tables:\n%s", got)
	}
}

func TestIstioIptablesNetworkNamespaceNotANamespace(t *testing.T) {
	code, _, errOut := runIptables(t, nil, "ipv4", nil, "istio-iptables", "--network-namespace", os.DevNull, "--native-nftables", "--dry-run")
	if code != 1 || !strings.Contains(errOut, "not a namespace file") {
		t.Errorf("exit %d, %q; want 1 naming the file as not a namespace", code, errOut)
	}
}
