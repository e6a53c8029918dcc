package main

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// The image's commands run from its own root file system, as in a pod: the
// binary named pilot-agent answers every sub-command Istio's injector, hooks
// and tools call (help, istio-iptables with the iptables the image carries,
// wait, request), and the agent runs its whole tree with the image's Envoy
// (the stand-in), which its first log line names. The root file system is
// the unpacked image, entered with chroot inside a network namespace of the
// test's own (#20).
func TestImageRunsInItsRoot(t *testing.T) {
	testkit.RequireRoot(t, "chroot into the unpacked image, a network namespace, iptables in it", "ip", "chroot", "mount")
	o := builtImage(t)
	root := unpack(t, o)
	ns := netns(t)
	run := func(user string, args ...string) (string, error) {
		cmd := inRoot(ns, root, user, args...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	must := func(user string, args ...string) string {
		t.Helper()
		out, err := run(user, args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	contains := func(what, out string, wants ...string) {
		t.Helper()
		testkit.Contains(t, what, out, wants...)
	}

	contains("pilot-agent --help", must("", "/usr/local/bin/pilot-agent", "--help"), "\n  pilot-agent [command]", "istio-iptables", "wait", "request")
	contains("meshagent --help", must("", "/usr/local/bin/meshagent", "--help"), "\n  meshagent [command]")
	// The entrypoint as the kubelet runs it, the container's args appended:
	// meshagent-init, not PID 1 here, replaces itself with the agent (#36).
	cf, err := load(t, o).ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	contains("the entrypoint with --help", must("", append(cf.Config.Entrypoint, "--help")...), "\n  pilot-agent [command]")
	contains("pilot-agent istio-iptables --help", must("", "pilot-agent", "istio-iptables", "--help"), "pilot-agent istio-iptables")
	contains("pilot-agent wait --help", must("", "pilot-agent", "wait", "--help"), "pilot-agent wait")
	contains("pilot-agent request --help", must("", "pilot-agent", "request", "--help"), "pilot-agent request")

	// istio-init: the injector's arguments (REDIRECT mode), as root, with
	// the image's iptables; every backend's save runs.
	must("", "pilot-agent", "istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT",
		"-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020", "--log_output_level=default:info")
	contains("iptables-save after istio-iptables", must("", "iptables-save"),
		"-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001", "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006")
	for _, save := range []string{"ip6tables-save", "iptables-legacy-save", "ip6tables-legacy-save", "iptables-nft-save"} {
		must("", save)
	}

	// The sidecar: the whole tree with the image's Envoy, as istio-proxy.
	mesh, err := os.ReadFile("../../testdata/standalone/mesh.yaml")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "tmp/mesh.yaml"), mesh)
	if err := os.Mkdir(filepath.Join(root, "tmp/agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(root, "tmp/agent"), proxyUID, proxyGID); err != nil {
		t.Fatal(err)
	}
	log := testkit.NewLogBuffer(t)
	agent := inRoot(ns, root, "1337:1337", "pilot-agent", "standalone", "--root", "/tmp/agent", "--mesh", "/tmp/mesh.yaml")
	agent.Stdout, agent.Stderr = log, log
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		agent.Process.Signal(syscall.SIGKILL) // Envoy has Pdeathsig
		agent.Wait()
	})
	out, err := run("1337:1337", "pilot-agent", "wait", "--timeoutSeconds", "30")
	if err != nil {
		t.Fatalf("pilot-agent wait: %v\n%s\nagent log:\n%s", err, out, log.String())
	}
	contains("pilot-agent wait", out, "Envoy is ready!")
	contains("pilot-agent request GET server_info", must("1337:1337", "pilot-agent", "request", "GET", "server_info"), `"state": "LIVE"`)
	contains("the agent's log", log.String(), `envoy="/usr/local/bin/envoy (the stand-in Envoy, testdata/fakeenvoy`,
		// The capture listeners the control plane sent over LDS, opened.
		"relay virtualOutbound on 0.0.0.0:15001", "relay virtualInbound on 0.0.0.0:15006")
}

// inRoot is a command run in network namespace ns with root as its root
// directory, as user ("uid:gid"; "" is root).
func inRoot(ns, root, user string, args ...string) *exec.Cmd {
	chroot := []string{"netns", "exec", ns, "chroot"}
	if user != "" {
		chroot = append(chroot, "--userspec="+user)
	}
	cmd := exec.Command("ip", append(append(chroot, root), args...)...)
	cmd.Env = []string{"PATH=" + path} // the image's; nothing of the test's environment
	return cmd
}

// netns is a network namespace with its loopback up, removed at the end.
func netns(t *testing.T) string {
	t.Helper()
	ns := fmt.Sprintf("mkimage-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v %s", err, out)
	}
	return ns
}

// unpack writes the image's file system under a temporary directory, with
// owners and modes, plus what a container runtime provides: /dev/null and
// /proc.
func unpack(t *testing.T, o *options) string {
	t.Helper()
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil { // it is "/" for istio-proxy
		t.Fatal(err)
	}
	rc := mutate.Extract(load(t, o))
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, filepath.Clean("/"+h.Name))
		// mutate.Extract gives the top layer's entries first: `meshagent
		// image`'s layer has no directory entries (it keeps the base's).
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600); err == nil {
				_, err = io.Copy(f, tr)
				f.Close()
			}
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		default:
			t.Fatalf("%s: unexpected type %c", h.Name, h.Typeflag)
		}
		if err == nil {
			err = os.Lchown(p, h.Uid, h.Gid)
		}
		if err == nil && h.Typeflag != tar.TypeSymlink {
			err = os.Chmod(p, os.FileMode(h.Mode&0o777)|modeBits(h.Mode))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// What the runtime mounts over the image's /etc: a resolver (the capture
	// settings and the DNS proxy read it).
	testkit.WriteFile(t, filepath.Join(root, "etc/resolv.conf"), []byte("nameserver 127.0.0.1\n"))
	os.Chmod(filepath.Join(root, "etc/resolv.conf"), 0o644)
	for _, d := range []string{"dev", "proc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mknod(filepath.Join(root, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(root, "dev/null"), 0o666) // past the umask
	proc := filepath.Join(root, "proc")
	if out, err := exec.Command("mount", "-t", "proc", "proc", proc).CombinedOutput(); err != nil {
		t.Fatalf("mount proc: %v %s", err, out)
	}
	t.Cleanup(func() {
		for range 50 { // the agent's processes may hold it for a moment
			if exec.Command("umount", proc).Run() == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		exec.Command("umount", "-l", proc).Run()
	})
	return root
}

func modeBits(m int64) os.FileMode {
	var fm os.FileMode
	if m&0o1000 != 0 {
		fm |= os.ModeSticky
	}
	if m&0o2000 != 0 {
		fm |= os.ModeSetgid
	}
	if m&0o4000 != 0 {
		fm |= os.ModeSetuid
	}
	return fm
}

// writeFile writes a file istio-proxy owns.
func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	testkit.WriteFile(t, p, b)
	if err := os.Chown(p, proxyUID, proxyGID); err != nil {
		t.Fatal(err)
	}
}
