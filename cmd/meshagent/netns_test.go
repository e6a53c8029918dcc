package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
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

// clean-iptables --network-namespace cleans the pod's namespace, not the
// caller's (#33: it took the flag, never entered the namespace, removed
// the node's capture rules and left the pod's).
func TestCleanIptablesNetworkNamespace(t *testing.T) {
	testkit.RequireRoot(t, "enters network namespaces", "unshare", "nsenter", "ip", "iptables-save")
	runtime.LockOSThread() // "the host": a namespace of this test's own, as above
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Fatal(err)
	}
	args := []string{"-i", "*", "-b", "*", "-d", "15020,15021,15090"}
	if code, _, errOut := runIptables(t, nil, "ipv4", nil, append([]string{"istio-iptables"}, args...)...); code != 0 {
		t.Fatalf("capture in the host namespace: exit %d: %s", code, errOut)
	}
	pod := podNetns(t)
	if code, _, errOut := runIptables(t, nil, "ipv4", nil, append([]string{"istio-iptables", "--network-namespace", pod}, args...)...); code != 0 {
		t.Fatalf("capture in the pod: exit %d: %s", code, errOut)
	}
	code, _, errOut := runIptables(t, nil, "ipv4", nil, "clean-iptables", "--network-namespace", pod)
	if code != 0 {
		t.Fatalf("clean-iptables --network-namespace: exit %d: %s", code, errOut)
	}
	if got := nsRun(t, pod, "iptables-save"); strings.Contains(got, "ISTIO_") {
		t.Errorf("the pod's rules are still there:\n%s", got)
	}
	if out, _ := exec.Command("iptables-save", "-t", "nat").CombinedOutput(); !strings.Contains(string(out), ":ISTIO_OUTPUT") {
		t.Errorf("the host's rules were removed:\n%s", out)
	}
}

// Every command that takes --network-namespace checks it names a network
// namespace before anything is applied (#33): a FIFO failed to return
// (the open blocked for ever, no log line); an empty value programmed the
// caller's own namespace; another kind of namespace is not a network one.
func TestNetworkNamespaceFlagIsChecked(t *testing.T) {
	testkit.RequireRoot(t, "opens this process's mount namespace file")
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"istio-iptables", "clean-iptables"} {
		for _, tc := range []struct {
			path, want string
			code       int
		}{
			{fifo, "--network-namespace " + fifo + ": not a namespace file (nsfs): a FIFO", 1},
			{"", "--network-namespace is empty", 2},
			{"/proc/self/ns/mnt", "a namespace file, but not of a network namespace", 1},
			{os.DevNull, "not a namespace file (nsfs): a character device", 1},
		} {
			t.Run(cmd+" "+tc.path, func(t *testing.T) {
				type result struct {
					code   int
					stderr string
				}
				done := make(chan result, 1)
				go func() {
					code, _, errOut := runIptables(t, nil, "ipv4", nil, cmd, "--network-namespace", tc.path, "--dry-run")
					done <- result{code, errOut}
				}()
				var r result
				testkit.WaitFor(t, cmd+" to return", func() bool {
					select {
					case r = <-done:
						return true
					default:
						return false
					}
				})
				if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
					t.Errorf("exit %d, %q; want %d saying %q", r.code, r.stderr, tc.code, tc.want)
				}
			})
		}
	}
}
