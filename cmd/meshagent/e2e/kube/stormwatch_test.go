package kube

import (
	"bufio"
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// podWatch follows the pods of one app label through `kubectl get
// --watch`: when each turned Ready, when it left Ready, when it was deleted.
type podWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced at every event
	readyAt  map[string]time.Time
	ready    map[string]bool
	live     map[string]bool
	unready  int // Ready → not Ready transitions since the baseline
	baseline bool
}

func (n *node) watchPods(t *testing.T, label string) *podWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &podWatch{cancel: cancel, done: make(chan struct{}), changed: make(chan struct{}),
		readyAt: map[string]time.Time{}, ready: map[string]bool{}, live: map[string]bool{}}
	cmd := n.inNetns(ctx, filepath.Join(n.kubeBin, "kubectl"), "--kubeconfig", filepath.Join(n.root, "pki", "admin.kubeconfig"),
		"-n", testNS, "get", "pods", "-l", "app="+label, "--watch", "--output-watch-events", "-o",
		`jsonpath={.type} {.object.metadata.name} {.object.status.conditions[?(@.type=="Ready")].status}{"\n"}`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.event(strings.Fields(sc.Text()), time.Now())
		}
		cmd.Wait()
	}()
	return w
}

func (w *podWatch) event(f []string, at time.Time) {
	if len(f) < 2 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	name := f[1]
	ready := len(f) > 2 && f[2] == "True"
	switch f[0] {
	case "DELETED":
		delete(w.live, name)
	default:
		w.live[name] = true
		if ready && w.readyAt[name].IsZero() {
			w.readyAt[name] = at
		}
		if w.baseline && w.ready[name] && !ready {
			w.unready++
		}
		w.ready[name] = ready
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

// waitFor waits until cond (called with w.mu held) holds.
func (w *podWatch) waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		ok, changed := cond(), w.changed
		w.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-deadline:
			return false
		}
	}
}

func (w *podWatch) waitReady(pods int, timeout time.Duration) bool {
	return w.waitFor(timeout, func() bool { return len(w.readyAt) >= pods })
}

func (w *podWatch) waitGone(timeout time.Duration) bool {
	return w.waitFor(timeout, func() bool { return len(w.live) == 0 })
}

func (w *podWatch) readyTimes() []time.Time {
	return slices.Collect(maps.Values(w.readyTimesByPod()))
}

// readyTimesByPod are the pods' first Ready, by pod.
func (w *podWatch) readyTimesByPod() map[string]time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.readyAt)
}

// markReadyBaseline starts counting pods that leave Ready.
func (w *podWatch) markReadyBaseline() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.baseline, w.unready = true, 0
}

func (w *podWatch) unreadySinceBaseline() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.unready
}

func (w *podWatch) stop() {
	w.cancel()
	<-w.done
}
