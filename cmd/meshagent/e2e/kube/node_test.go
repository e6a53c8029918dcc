package kube

// The node the suite runs on: the kube peer (../shared/peers/kube) brought
// up, Istio on it (hack/kube/istio-up.sh), torn down by the same test
// whatever happens, because the kubelet changes machine-wide sysctls while it
// runs (the peer's down.sh puts them back).

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// node is the running node and what the suite knows of its layout; every
// path comes from hack/kube/common.sh (and through it the peer's env.sh),
// the one place they are set.
type node struct {
	repo, hack string // the checkout; hack/kube
	kubePeer   string // ../shared/peers/kube
	kubeBin    string // kube-apiserver, kubelet, kubectl, ...
	istioBin   string // pilot-discovery, istioctl, kube-proxy, coredns
	root       string // the node's state (/tmp/kubenode)
	istioRoot  string // what istio-up.sh started (pids, logs)
	netns      string
	registry   string // $KN_REGISTRY: host:port the node's containerd pulls from over plain HTTP
	downOnce   sync.Once
}

// layout reads the paths common.sh computes.
func layout(t *testing.T) *node {
	t.Helper()
	repo, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	hack := filepath.Join(repo, "hack", "kube")
	out, err := exec.Command("bash", "-c", `. "$0/common.sh" && printf '%s\n' "$KUBE_PEER" "$KUBE_BIN" "$ISTIO_KUBE_BIN" "$KN_ROOT" "$IK_ROOT" "$KN_NETNS" "$KN_REGISTRY"`, hack).CombinedOutput()
	if err != nil {
		t.Fatalf("hack/kube/common.sh: %v\n%s", err, out)
	}
	f := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(f) != 7 {
		t.Fatalf("hack/kube/common.sh printed %q", out)
	}
	return &node{repo: repo, hack: hack, kubePeer: f[0], kubeBin: f[1], istioBin: f[2], root: f[3], istioRoot: f[4], netns: f[5], registry: f[6]}
}

// requireBuilt fails (never skips: `make test` builds them) when a binary
// the suite needs is missing, naming the script that builds it.
func (n *node) requireBuilt(t *testing.T) {
	t.Helper()
	for _, b := range []struct{ dir, name, how string }{
		{n.kubeBin, "kube-apiserver", n.kubePeer + "/build.sh"},
		{n.kubeBin, "kubelet", n.kubePeer + "/build.sh"},
		{n.kubeBin, "kubectl", n.kubePeer + "/build.sh"},
		{n.istioBin, "pilot-discovery", "hack/kube/build-istio.sh"},
		{n.istioBin, "istioctl", "hack/kube/build-istio.sh"},
		{n.istioBin, "kube-proxy", "hack/kube/build-istio.sh"},
		{n.istioBin, "coredns", "hack/kube/build-istio.sh"},
	} {
		if _, err := os.Stat(filepath.Join(b.dir, b.name)); err != nil {
			t.Fatalf("%s is not built (%v): run %s (`make test` or `make peers` builds every peer once per machine)", b.name, err, b.how)
		}
	}
}

// up starts the node, and registers its teardown (Istio's too) first, so
// that a failure half-way still stops everything. The teardown also runs
// on SIGINT/SIGTERM and shortly before the test binary's deadline, when a
// cleanup would not run (a timeout panics).
func (n *node) up(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/run/netns/" + n.netns); err == nil {
		t.Fatalf("netns %s exists: a node is already up (run %s/down.sh)", n.netns, n.kubePeer)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		close(done)
		n.down(t.Logf, t.Errorf, t.Failed())
	})
	go n.guard(t, done)
	start := time.Now()
	n.script(t, 3*time.Minute, nil, filepath.Join(n.kubePeer, "up.sh"))
	t.Logf("node up in %v", time.Since(start).Round(100*time.Millisecond))
}

// istioUp starts Istio on the node (istio-up.sh). The injector's default
// image is defaultImage, and every injected container has pullPolicy
// (Always: the kubelet pulls each sidecar from the registry, #32); every
// pod of the suite names its own image by annotation.
func (n *node) istioUp(t *testing.T, defaultImage, pullPolicy string) {
	t.Helper()
	start := time.Now()
	n.script(t, 4*time.Minute, []string{"MESHAGENT_PROXY_IMAGE=" + defaultImage, "ISTIO_VALUES=--set values.global.imagePullPolicy=" + pullPolicy},
		filepath.Join(n.hack, "istio-up.sh"))
	t.Logf("istio up in %v", time.Since(start).Round(100*time.Millisecond))
}

// guard tears the node down and exits when the run is interrupted or about
// to hit its -timeout, since the kubelet's machine-wide sysctls must not
// outlive the test.
func (n *node) guard(t *testing.T, done <-chan struct{}) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	var deadline <-chan time.Time
	if d, ok := t.Deadline(); ok {
		timer := time.NewTimer(time.Until(d) - 90*time.Second)
		defer timer.Stop()
		deadline = timer.C
	}
	select {
	case <-done:
		return
	case s := <-sig:
		fmt.Fprintf(os.Stderr, "kube suite: %v: tearing the node down\n", s)
	case <-deadline:
		fmt.Fprintln(os.Stderr, "kube suite: 90 s before the test deadline: tearing the node down")
	}
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	n.down(logf, logf, true)
	os.Exit(1)
}

// down stops Istio and the node, at most once; it reports, never stops, as
// a cleanup must.
func (n *node) down(logf, errorf func(string, ...any), failed bool) {
	n.downOnce.Do(func() {
		if failed || os.Getenv("MESHAGENT_KUBE_LOGS") != "" {
			n.dumpLogs(logf)
		}
		for _, s := range []string{filepath.Join(n.hack, "istio-down.sh"), filepath.Join(n.kubePeer, "down.sh")} {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			out, err := exec.CommandContext(ctx, "bash", s).CombinedOutput()
			cancel()
			if err != nil {
				errorf("%s: %v\n%s", s, err, out)
			}
		}
	})
}

// dumpLogs copies the node's and istiod's logs out of the state directory
// down.sh removes, and says where.
func (n *node) dumpLogs(logf func(string, ...any)) {
	dir := filepath.Join(n.repo, ".tmp", "kube-logs")
	_ = os.RemoveAll(dir)
	_ = os.MkdirAll(dir, 0o755)
	for _, src := range []string{filepath.Join(n.root, "logs"), filepath.Join(n.istioRoot, "logs"), filepath.Join(n.root, "pod-logs")} {
		_ = exec.Command("cp", "-rL", src, filepath.Join(dir, filepath.Base(filepath.Dir(src))+"-"+filepath.Base(src))).Run()
	}
	logf("node, istiod and pod logs copied to %s", dir)
}

func (n *node) script(t *testing.T, timeout time.Duration, env []string, path string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{path}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", path, err, out)
	}
	return string(out)
}

// inNetns runs a command inside the node's network namespace only (not
// `ip netns exec`, which remounts /sys: the peer's README, blocker 2).
func (n *node) inNetns(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + n.netns, name}, args...)...)
}

// kubectl runs the node's kubectl as admin; stdin may be empty.
func (n *node) kubectl(stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := n.inNetns(ctx, filepath.Join(n.kubeBin, "kubectl"), append([]string{"--kubeconfig", filepath.Join(n.root, "pki", "admin.kubeconfig")}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

func (n *node) mustKubectl(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, err := n.kubectl(stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// loadBinary packs a static binary as an image with the peer's
// load-image.sh.
func (n *node) loadBinary(t *testing.T, ref, bin, path string) {
	t.Helper()
	n.script(t, 2*time.Minute, nil, filepath.Join(n.kubePeer, "load-image.sh"), ref+"="+bin+":"+path)
}

// istiodGet GETs a path of istiod's debug HTTP server (/debug/syncz). It
// answers localhost without credentials (allowAuthenticatedOrLocalhost), and
// istiod runs in the node's netns.
func (n *node) istiodGet(path string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := n.inNetns(ctx, "curl", "-sf", "http://127.0.0.1:8080"+path).Output()
	return string(out), err
}

// execOut runs a command on the host and returns its stdout.
func execOut(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	return string(out), err
}
