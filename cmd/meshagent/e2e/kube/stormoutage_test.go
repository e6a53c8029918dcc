package kube

// What the pods' clients see while istiod is away and comes back (#36's
// reconnect storm): requests on connections opened before it went, and a
// name the mesh learnt while it was away.

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// outageClientPods is how many pods of a storm carry the clients (fewer,
// k, when the storm has fewer than twice as many pods): pod i keeps a
// connection to pod k+i, through both sidecars, and waits for the new name.
const outageClientPods = 4

// podCmd is a command running in a pod's container through `kubectl exec
// -i`, read as it prints; closing its stdin is how it is told to finish.
type podCmd struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    testkit.LogBuffer // its stdout and stderr
	done   chan struct{}
	err    error
	cancel context.CancelFunc
}

func (w *podCmd) output() string { return w.out.String() }

// startExec starts args in a container of a pod, for at most limit.
func (n *node) startExec(t *testing.T, pod, container string, limit time.Duration, args ...string) *podCmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	w := &podCmd{done: make(chan struct{}), cancel: cancel}
	w.cmd = n.inNetns(ctx, filepath.Join(n.kubeBin, "kubectl"), append([]string{"--kubeconfig", filepath.Join(n.root, "pki", "admin.kubeconfig"),
		"-n", testNS, "exec", "-i", pod, "-c", container, "--"}, args...)...)
	w.cmd.Stdout, w.cmd.Stderr = &w.out, &w.out
	var err error
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatalf("kubectl exec %s: %v", pod, err)
	}
	go func() {
		w.err = w.cmd.Wait()
		cancel()
		close(w.done)
	}()
	return w
}

// waitFor waits until the command has printed a line starting with
// prefix, or has ended, or timeout.
func (w *podCmd) waitFor(prefix string, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if lineWith(w.output(), prefix) != "" {
			return true
		}
		select {
		case <-w.done:
			return lineWith(w.output(), prefix) != ""
		default:
		}
	}
	return false
}

// finish closes the command's stdin and waits for it to end, for at most
// timeout (then it is killed).
func (w *podCmd) finish(timeout time.Duration) {
	w.stdin.Close()
	select {
	case <-w.done:
	case <-time.After(timeout):
		w.cancel()
		<-w.done
	}
}

// lineWith is the first line of out that starts with prefix, or "".
func lineWith(out, prefix string) string {
	for l := range strings.Lines(out) {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// outage is the clients of one reconnect storm.
type outage struct {
	keeps, waits []*podCmd
	name, ip     string // the ServiceEntry made while istiod is away
}

// startKeeps opens, in each client pod, a connection to its peer and
// sends on it every 100 ms, and waits until each has had an answer.
func (s *suite) startKeeps(t *testing.T, label string, pods int) *outage {
	o := &outage{}
	k := min(outageClientPods, pods/2)
	for i := range k {
		peer := s.n.getPod(t, fmt.Sprintf("%s-%d", label, k+i))
		o.keeps = append(o.keeps, s.n.startExec(t, fmt.Sprintf("%s-%d", label, i), "app", 10*time.Minute,
			"/kubeapp", "keep", "http://"+peer.Status.PodIP+":8080/", "100ms", "9m"))
	}
	for i, w := range o.keeps {
		if !w.waitFor("open", time.Minute) {
			t.Fatalf("%s-%d: no answer from its peer within a minute: %s", label, i, w.output())
		}
		// Through the peer's sidecar: its inbound relay connects to the
		// app from 127.0.0.6, as Istio's Envoy does.
		if open := lineWith(w.output(), "open"); !strings.Contains(open, " to 127.0.0.6:") {
			t.Fatalf("%s-%d: the peer's app did not see its sidecar connect: %q", label, i, open)
		}
	}
	return o
}

// learnName makes a ServiceEntry, istiod being away, and has each client
// pod resolve its name until the name table has it: the DNS table current
// again once istiod is back.
func (s *suite) learnName(t *testing.T, o *outage, label string) {
	s.mu.Lock()
	s.outages++
	n := s.outages
	s.mu.Unlock()
	o.name, o.ip = fmt.Sprintf("late-%d.e2e.internal", n), fmt.Sprintf("240.240.21.%d", n%250+1)
	s.n.mustKubectl(t, fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: late-%d, namespace: %s}
spec:
  hosts: [%s]
  addresses: [%s]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.244.0.250}]
`, n, testNS, o.name, o.ip), "apply", "-f", "-")
	for i := range o.keeps {
		o.waits = append(o.waits, s.n.startExec(t, fmt.Sprintf("%s-%d", label, i), "app", 10*time.Minute,
			"/kubeapp", "resolvewait", o.name, o.ip, "9m"))
	}
}

// endOutage ends the clients once every pod is synced again and records
// what they saw: requests and broken connections, and when the name
// resolved (from restart).
func (s *suite) endOutage(t *testing.T, o *outage, r *stormResult, restart time.Time) {
	deadline := time.Now().Add(time.Minute) // for all: they wait at once
	for _, w := range o.waits {
		if !w.waitFor("resolved", time.Until(deadline)) {
			r.namesMissing++
			t.Logf("%s not resolved a minute after the pods synced: %s", o.name, w.output())
		}
		w.finish(5 * time.Second)
		if at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(lineWith(w.output(), "resolved "), "resolved ")); err == nil {
			r.nameCurrent = append(r.nameCurrent, at.Sub(restart))
		}
	}
	slices.Sort(r.nameCurrent)
	for _, w := range o.keeps {
		w.finish(15 * time.Second)
		out := w.output()
		var ok, fail, conns int
		if _, err := fmt.Sscanf(lineWith(out, "keep "), "keep ok=%d fail=%d conns=%d", &ok, &fail, &conns); err != nil {
			t.Errorf("a client of the outage did not report (%v): %s", w.err, out)
			continue
		}
		r.outageOK += ok
		r.outageFailed += fail
		r.brokenConns += conns - 1
		for l := range strings.Lines(out) {
			if strings.HasPrefix(l, "fail ") && len(r.outageFailures) < 3 {
				r.outageFailures = append(r.outageFailures, strings.TrimSpace(l))
			}
		}
	}
	s.n.mustKubectl(t, "", "-n", testNS, "delete", "serviceentry", strings.TrimSuffix(o.name, ".e2e.internal"))
}
