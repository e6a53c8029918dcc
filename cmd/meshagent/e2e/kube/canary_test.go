package kube

// The canary an operator would run (#32): a Deployment of 3 replicas behind
// a Service, injected by Istio's webhook with Istio's agent, and a meshed
// client calling the Service without pause. The Deployment is switched to
// meshagent by its pod template's sidecar.istio.io/proxyImage annotation,
// `kubectl rollout status`, then rolled back (`kubectl rollout undo`); the
// client counts the requests that failed across both. The oracle is the
// same run with Istio's agent on both sides (a restart by a template
// change, then the same undo). Goal: no failed request.

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	canaryApp    = "canary"
	canaryClient = "canary-client"
	// canaryDrain is how long a canary pod's app keeps serving after its
	// SIGTERM (with Connection: close), while the endpoint controller and
	// kube-proxy take it out of the Service: as a real app's preStop sleep.
	canaryDrain = 5 * time.Second
)

// canaries runs the oracle's rollout and ours on one Deployment, with one
// client, and records each agent's failed requests.
func (s *suite) canaries(t *testing.T, agents []agent) {
	var oracle, ours agent
	for _, a := range agents {
		if a.oracle {
			oracle = a
		} else {
			ours = a
		}
	}
	if oracle.name == "" {
		return
	}
	t.Run("canary", func(t *testing.T) {
		n := s.n
		n.mustKubectl(t, canaryManifests(n, oracle.image), "apply", "-f", "-")
		if err := s.rolledOut(t, oracle.image); err != nil {
			t.Fatal(err)
		}
		n.mustKubectl(t, canaryClientPod(oracle.image).manifest(n), "apply", "-f", "-")
		if _, err := n.kubectl("", "-n", testNS, "wait", "--for=condition=Ready", "pod/"+canaryClient, "--timeout=3m"); err != nil {
			t.Fatalf("%v\n%s", err, n.describe(canaryClient))
		}
		if err := s.clientCalling(t); err != nil {
			t.Fatal(err)
		}
		// Istio → Istio: a restart by a template change, and its undo.
		t.Run(oracle.name, func(t *testing.T) {
			s.check(t, oracle, "", "canary-rollout-rollback", func(t *testing.T) error {
				return s.canaryRun(t, oracle, []string{"rollout", "restart", "deployment/" + canaryApp}, oracle.image, oracle.image)
			})
		})
		// Istio → meshagent by the annotation, and back.
		t.Run(ours.name, func(t *testing.T) {
			s.check(t, ours, "", "canary-rollout-rollback", func(t *testing.T) error {
				patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"sidecar.istio.io/proxyImage":%q}}}}}`, ours.image)
				return s.canaryRun(t, ours, []string{"patch", "deployment/" + canaryApp, "--type=merge", "-p", patch}, ours.image, oracle.image)
			})
		})
		n.kubectl("", "-n", testNS, "delete", "pod/"+canaryClient, "deployment/"+canaryApp, "--wait=false")
	})
}

// canaryRun changes the Deployment with change, waits for its rollout to
// runImage, rolls it back (to backImage), and counts what the client saw
// meanwhile.
func (s *suite) canaryRun(t *testing.T, a agent, change []string, runImage, backImage string) error {
	before, err := s.clientCounts(t)
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := s.n.kubectl("", append([]string{"-n", testNS}, change...)...); err != nil {
		return err
	}
	if err := s.rolledOut(t, runImage); err != nil {
		return err
	}
	rolled := time.Since(start)
	if _, err := s.n.kubectl("", "-n", testNS, "rollout", "undo", "deployment/"+canaryApp); err != nil {
		return err
	}
	if err := s.rolledOut(t, backImage); err != nil {
		return err
	}
	// The client prints its totals every second: one more line after the
	// last old pod is gone.
	time.Sleep(2500 * time.Millisecond)
	after, err := s.clientCounts(t)
	if err != nil {
		return err
	}
	total, failed := after.ok+after.fail-before.ok-before.fail, after.fail-before.fail
	newPods := after.pods[len(before.pods):]
	s.figure(a, "", "canary requests failed / sent", fmt.Sprintf("%d / %d", failed, total))
	t.Logf("%s: rollout %v, rollout and rollback %v: %d requests, %d failed; answered by %d new pods %v", a.name, rolled.Round(100*time.Millisecond),
		time.Since(start).Round(100*time.Millisecond), total, failed, len(newPods), newPods)
	switch {
	case total == 0:
		return fmt.Errorf("the client sent no request during the rollout")
	case len(newPods) < 6:
		// 3 pods rolled out and 3 rolled back: had the client stayed on
		// its old connections, nothing would have been tested.
		return fmt.Errorf("only %d pods started by the rollout and rollback answered the client (%v), want 6", len(newPods), newPods)
	case failed > 0:
		return fmt.Errorf("%d of %d requests failed across the rollout and rollback; the first: %s", failed, total, strings.Join(after.failures[min(before.fails, len(after.failures)):min(before.fails+5, len(after.failures))], "; "))
	}
	return nil
}

// rolledOut waits for the Deployment's rollout and checks every pod it
// runs has image as its sidecar.
func (s *suite) rolledOut(t *testing.T, image string) error {
	if out, err := s.n.kubectl("", "-n", testNS, "rollout", "status", "deployment/"+canaryApp, "--timeout=5m"); err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	// The old pods may still be terminating (a deletion time, a third
	// field): the others are what the rollout left running.
	var running int
	for _, l := range strings.Split(s.n.mustKubectl(t, "", "-n", testNS, "get", "pods", "-l", "app="+canaryApp, "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp} {.spec.initContainers[?(@.name=="istio-proxy")].image}{"\n"}{end}`), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		running++
		if f[1] != image {
			return fmt.Errorf("pod %s runs sidecar %s after the rollout, want %s", f[0], f[1], image)
		}
	}
	if running != 3 {
		return fmt.Errorf("%d pods running after the rollout, want 3", running)
	}
	return nil
}

// clientCalling waits until the client has answers.
func (s *suite) clientCalling(t *testing.T) error {
	var last clientCounts
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		c, err := s.clientCounts(t)
		if err != nil {
			return err
		}
		if c.ok > 0 {
			t.Logf("the client calls the Service: %d answered, %d failed so far", c.ok, c.fail)
			return nil
		}
		last = c
	}
	return fmt.Errorf("the client had no answer in 30 s (%d failed: %v)", last.fail, last.failures)
}

type clientCounts struct {
	ok, fail int
	fails    int      // failure lines in the log
	failures []string // every failure line
	pods     []string // the pods that answered, in the order first seen
}

var countLine = regexp.MustCompile(`^count ok=(\d+) fail=(\d+)$`)

// clientCounts reads the client's log: its last totals, and every failure.
func (s *suite) clientCounts(t *testing.T) (clientCounts, error) {
	var c clientCounts
	out, err := s.n.kubectl("", "-n", testNS, "logs", canaryClient, "-c", "app")
	if err != nil {
		return c, err
	}
	for _, l := range strings.Split(out, "\n") {
		if m := countLine.FindStringSubmatch(l); m != nil {
			c.ok, _ = strconv.Atoi(m[1])
			c.fail, _ = strconv.Atoi(m[2])
		} else if strings.HasPrefix(l, "fail ") {
			c.failures = append(c.failures, l)
		} else if pod, ok := strings.CutPrefix(l, "from "); ok {
			c.pods = append(c.pods, pod)
		}
	}
	c.fails = len(c.failures)
	return c, nil
}

// canaryPods are the Deployment's pods (kubeapp serve, draining for
// canaryDrain, native sidecars with image).
func canaryPods(image string) podSpec {
	return podSpec{app: canaryApp, serviceAccount: "sa-" + canaryApp, proxyImage: image, native: true, appDrain: canaryDrain}
}

// canaryManifests are the Deployment of 3 canaryPods, its Service and
// service account.
func canaryManifests(n *node, image string) string {
	deployment, err := json.Marshal(map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": canaryApp, "namespace": testNS},
		"spec": map[string]any{
			"replicas": 3,
			"selector": map[string]any{"matchLabels": map[string]string{"app": canaryApp}},
			"template": canaryPods(image).template(n),
		},
	})
	if err != nil {
		panic(err) // maps of strings and numbers
	}
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: sa-%[1]s, namespace: %[2]s}
---
apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  selector: {app: %[1]s}
  ports: [{name: http, port: 8080, targetPort: 8080}]
---
%[3]s
`, canaryApp, testNS, deployment)
}

// canaryClientPod is the meshed client pod: its app calls the Service by name
// without pause.
func canaryClientPod(image string) podSpec {
	return podSpec{name: canaryClient, app: canaryClient, serviceAccount: "sa-" + canaryApp, proxyImage: image, native: true,
		command: []string{"/kubeapp", "load", "http://" + canaryApp + "." + testNS + ".svc.cluster.local:8080/"}}
}
