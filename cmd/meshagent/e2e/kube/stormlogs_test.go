package kube

// What the storms read from the node's logs (#36): the sidecars' log files
// as the kubelet writes them (each line with its time), containerd's log
// for when each sidecar container started, and istiod's for when each
// sidecar came back to it after its restart.

import (
	"encoding/json"
	"fmt"
	"iter"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// timeoutLine is a timeout as either agent logs it (certificate, xDS, or
// the readiness check's call to Envoy), and not a setting whose name ends
// in Timeout (our "effective configuration" line at start).
var timeoutLine = regexp.MustCompile(`(?i)(timed out|deadline exceeded|i/o timeout|\btimeout\b[^=])`)

// sidecarTimeouts greps the istio-proxy logs of the pods (sidecarLogs) for
// timeouts.
func sidecarTimeouts(label string, pods int, logs map[string]string) []string {
	var hits []string
	for i := range pods {
		pod := fmt.Sprintf("%s-%d", label, i)
		for l := range strings.Lines(logs[pod]) {
			if timeoutLine.MatchString(l) {
				hits = append(hits, fmt.Sprintf("%s: %s", pod, strings.TrimSuffix(l, "\n")))
			}
		}
	}
	return hits
}

// sidecarLogs are the istio-proxy logs of the pods of label, by pod, each
// read once for everything measured from them at one moment.
func (s *suite) sidecarLogs(label string, pods int) map[string]string {
	logs := map[string]string{}
	for i := range pods {
		pod := fmt.Sprintf("%s-%d", label, i)
		logs[pod] = s.sidecarLog(pod)
	}
	return logs
}

// sidecarLog is a pod's istio-proxy log as the kubelet writes it, each line
// starting with its time.
func (s *suite) sidecarLog(pod string) string { return s.containerLog(pod, "istio-proxy") }

// containerLog is the log of a container of a pod, as the kubelet writes
// it: in the directory of the pod's UID when known (setUIDs). The storm
// before, of the same agent, had pods of the same names, and the kubelet
// removes a deleted pod's logs only at its next container GC (a minute):
// read by name alone, the first "agent ready" of a pod in the second of
// two storms of ours in a row was at times its namesake's, minutes older.
func (s *suite) containerLog(pod, container string) string {
	dir := fmt.Sprintf("%s_%s_*", testNS, pod)
	s.mu.Lock()
	if uid := s.uids[pod]; uid != "" {
		dir = fmt.Sprintf("%s_%s_%s", testNS, pod, uid)
	}
	s.mu.Unlock()
	files, _ := filepath.Glob(filepath.Join(s.n.root, "pod-logs", dir, container, "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		b.Write(data)
	}
	return b.String()
}

// certificateLine is the line each agent logs when it has its workload
// certificate from istiod's CA, and readyLine the one when it first
// answers ready (Envoy ready, and for ours the agent too).
var (
	certificateLine = regexp.MustCompile(`msg="certificate from CA"|\tgenerated new workload certificate\t`)
	readyLine       = regexp.MustCompile(`msg="agent ready"|\tEnvoy proxy is ready`)
)

// firstMatch is, per pod, the kubelet's time of the first line of its log
// that matches: for the certificate (the key and the CSR, and what came
// before them; istiod has no CSR latency metric), and for ready.
func firstMatch(logs map[string]string, line *regexp.Regexp) map[string]time.Time {
	first := map[string]time.Time{}
	for pod, log := range logs {
		for at, l := range logLines(log) {
			if line.MatchString(l) {
				first[pod] = at
				break
			}
		}
	}
	return first
}

// between are, per pod in both, the time from one moment of its start to
// the next, sorted: its sidecar container started (containerStarts, the
// common mark: Istio's agent logs its first line in its package
// initialisation, ours after its configuration) → its certificate or
// ready line (firstMatch); the ready line → the application container
// started, the kubelet having waited for the sidecar's startup probe
// (every second) and its next relist; the application started → the pod
// Ready (the API server's watch).
func between(from, to map[string]time.Time) []time.Duration {
	var out []time.Duration
	for pod, at := range to {
		if start, ok := from[pod]; ok {
			out = append(out, at.Sub(start))
		}
	}
	slices.Sort(out)
	return out
}

// containerStarted is containerd's line for a container started.
var containerStarted = regexp.MustCompile(`^time="([^"]+)" level=info msg="StartContainer for \\"([0-9a-f]+)\\" returns successfully"`)

// containerStarts are, by pod, when containerd started each pod's
// container of that name (its log), for the pods of label: istio-proxy,
// or the application after it.
func (s *suite) containerStarts(t *testing.T, label, container string) map[string]time.Time {
	podOf := map[string]string{} // container ID → pod
	for _, p := range s.podList(t, label) {
		if st, ok := p.status(container); ok {
			podOf[strings.TrimPrefix(st.ContainerID, "containerd://")] = p.Metadata.Name
		}
	}
	data, err := os.ReadFile(filepath.Join(s.n.root, "logs", "containerd.log"))
	if err != nil {
		t.Errorf("containerd's log: %v", err)
	}
	starts := map[string]time.Time{}
	for l := range strings.Lines(string(data)) {
		m := containerStarted.FindStringSubmatch(l)
		if m == nil || podOf[m[2]] == "" {
			continue
		}
		if at, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
			starts[podOf[m[2]]] = at
		}
	}
	return starts
}

// podList is the pods of label, as the API server has them.
func (s *suite) podList(t *testing.T, label string) []pod {
	var list struct {
		Items []pod `json:"items"`
	}
	if err := json.Unmarshal([]byte(s.n.mustKubectl(t, "", "-n", testNS, "get", "pods", "-l", "app="+label, "-o", "json")), &list); err != nil {
		t.Fatalf("pods of %s: %v", label, err)
	}
	return list.Items
}

// setUIDs makes the pods of label the ones whose logs containerLog reads.
func (s *suite) setUIDs(t *testing.T, label string) {
	uids := map[string]string{}
	for _, p := range s.podList(t, label) {
		uids[p.Metadata.Name] = p.Metadata.UID
	}
	s.mu.Lock()
	s.uids = uids
	s.mu.Unlock()
}

// logLines are the lines of a log the kubelet wrote, with their times.
func logLines(log string) iter.Seq2[time.Time, string] {
	return func(yield func(time.Time, string) bool) {
		for l := range strings.Lines(log) {
			stamp, _, _ := strings.Cut(l, " ")
			at, err := time.Parse(time.RFC3339Nano, stamp)
			if err == nil && !yield(at, l) {
				return
			}
		}
	}
}

// startPhases are, per pod, where its start went before the agent ran:
// created → istio-init's last log line (the capture rules in place: each
// agent's istio-iptables ends its log there, by the kubelet's times), and
// created → its sidecar container's start (starts).
func (s *suite) startPhases(label string, pods int, created time.Time, starts map[string]time.Time) (toInitDone, toSidecar []time.Duration) {
	for i := range pods {
		pod := fmt.Sprintf("%s-%d", label, i)
		var last time.Time
		for at := range logLines(s.containerLog(pod, "istio-init")) {
			last = at
		}
		if !last.IsZero() {
			toInitDone = append(toInitDone, last.Sub(created))
		}
		if at, ok := starts[pod]; ok {
			toSidecar = append(toSidecar, at.Sub(created))
		}
	}
	slices.Sort(toInitDone)
	slices.Sort(toSidecar)
	return toInitDone, toSidecar
}

// keepSidecarLog copies a pod's istio-proxy log (the kubelet's file, each
// line with its time) to .tmp/kube-storm-logs before the pod is deleted:
// with the node's logs (MESHAGENT_KUBE_LOGS=1), where each pod's start
// went, container started → the agent's first line → its ready line.
func (s *suite) keepSidecarLog(t *testing.T, pod, log string) {
	dir := filepath.Join(s.n.repo, ".tmp", "kube-storm-logs")
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, pod+"-istio-proxy.log"), []byte(log), 0o644)
	}
	if err != nil {
		t.Log(err)
	}
}

// newConnection is istiod's line for a proxy's ADS stream (SotW or Delta),
// with the pod's name in the node ID ("<pod>.<namespace>-<n>").
var newConnection = regexp.MustCompile(`^(\S+)\s+info\s+\S+\s+ADS: new (?:delta )?connection for node:([^.\s]+)\.`)

// reconnects are, from istiod's log (the restarted istiod's: istio-up.sh
// writes it anew), when each pod of label first connected after restart,
// sorted.
func (s *suite) reconnects(t *testing.T, label string, restart time.Time) []time.Duration {
	data, err := os.ReadFile(filepath.Join(s.n.istioRoot, "logs", "istiod.log"))
	if err != nil {
		t.Errorf("istiod's log: %v", err)
		return nil
	}
	first := map[string]time.Duration{}
	for l := range strings.Lines(string(data)) {
		m := newConnection.FindStringSubmatch(l)
		if m == nil || !strings.HasPrefix(m[2], label+"-") {
			continue
		}
		if _, err := strconv.Atoi(strings.TrimPrefix(m[2], label+"-")); err != nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if _, seen := first[m[2]]; err == nil && !seen {
			first[m[2]] = at.Sub(restart)
		}
	}
	out := slices.Collect(maps.Values(first))
	slices.Sort(out)
	return out
}
