package kube

// The start and reconnect storms (#36, `make bench-kube-storm`): N pods
// (STORM_PODS, default 30), native sidecars injected by Istio's webhook,
// certificates from istiod's CA, created at once, once with each agent, in
// one run on the one node; then istiod stopped and started again with the N
// pods connected. STORM_ROUNDS rounds, the order turned each round; a table
// per round, ours beside Istio's agent's (stormtable_test.go); the pods
// followed through kubectl's watch (stormwatch_test.go), their phases and
// timeouts read from the node's logs (stormlogs_test.go), and what clients
// in them see while istiod is away (stormoutage_test.go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/procfs"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// TestKubeStorm runs only when MESHAGENT_KUBE_STORM is set (as root): it
// costs the whole machine for minutes.
func TestKubeStorm(t *testing.T) {
	if os.Getenv("MESHAGENT_KUBE_STORM") == "" {
		t.Skip("MESHAGENT_KUBE_STORM is not set (make bench-kube-storm)")
	}
	if ok, why := testkit.CanRoot("a network namespace, cgroups and mounts for the kube node"); !ok {
		t.Skip(why)
	}
	pods := testkit.EnvInt(t, "STORM_PODS", 30, 1, "pods")
	// STORM_ROUNDS: rounds of the two storms, the order turned each round
	// (default 2: Istio's agent, ours, ours, Istio's). The second storm of a
	// run met a warmer node and istiod: over the seven runs of #36's fourth
	// and fifth sessions ours was 0.78-0.92x Istio's p95 when it stormed
	// second and 0.96-1.40x when first, so a ratio of one order says as much
	// about the order as about the agents.
	rounds := testkit.EnvInt(t, "STORM_ROUNDS", 2, 1, "rounds")
	// STORM_FIRST=meshagent: ours storms first in the first round (Istio's
	// agent does by default): on a shared machine the load drifts between
	// the storms.
	oursFirst := testkit.EnvChoice(t, "STORM_FIRST", "the agent that storms first in the first round", "istio", "meshagent") == "meshagent"
	// STORM_FLOOR=1 (the default; 0 leaves it out): a third storm each round, with
	// a sidecar that costs nothing (testdata/floorproxy): the p95 no agent
	// can beat on this node, beside the two agents' (#36's goal is 0.8x
	// Istio's).
	floor := testkit.EnvChoice(t, "STORM_FLOOR", "1 for a storm with a sidecar that costs nothing each round", "1", "0") == "1"
	var floorBin string
	if floor { // before the node, so that a build failure costs none
		floorBin = buildStatic(t, "floorproxy")
	}
	// STORM_PROXY_CONFIG: a ProxyConfig (JSON) for every pod of both
	// agents, as the proxy.istio.io/config annotation: with
	// {"proxyMetadata":{"ECC_SIGNATURE_ALGORITHM":"ECDSA"}} both agents
	// make ECDSA keys (Istio's agent reads the same variable, #36).
	proxyConfig := os.Getenv("STORM_PROXY_CONFIG")
	if proxyConfig != "" && !json.Valid([]byte(proxyConfig)) {
		t.Fatalf("STORM_PROXY_CONFIG=%q: want a ProxyConfig as JSON", proxyConfig)
	}

	s := &suite{results: map[string]map[string]error{}, figures: map[string]map[string]string{}}
	// IfNotPresent, the image pulled on the node before each storm: with
	// Always every container start is a pull, and the kubelet's pull rate
	// limit (registryPullQPS 5, burst 10) failed dozens of them with "pull
	// QPS exceeded", then backed off for seconds, pod by pod at random.
	agents := s.setUp(t, true, "IfNotPresent")
	if oursFirst {
		slices.Reverse(agents)
	}
	// The floor between the two agents, so that with the order turned
	// each agent storms first in one round and last in the other. After
	// them (#36's sixth session) ours stormed second in every round, and
	// only Istio's agent ever had the run's first storm. (Whether the
	// place moves the p95 is within the runs' spread: #36's seventh
	// session, 1.02x over twelve rounds in the old order, 0.94x over ten
	// in this one.)
	if floor {
		agents = []agent{agents[0], s.floorAgent(t, floorBin), agents[1]}
	}
	// One pod of each agent first, not measured: the first storm would
	// otherwise also pay for a cold istiod (its first pushes, CSRs and
	// TokenReviews) and node, which the second finds warm.
	for _, a := range agents {
		if !a.floor {
			s.n.pull(t, a.image)
		}
		warm := podSpec{name: "warm-up-" + a.name, app: "warm-up", serviceAccount: "sa-" + a.name, proxyImage: a.image, native: true, proxyCPU: "10m", proxyConfig: proxyConfig}
		if _, err := s.n.createReady(t, warm, 3*time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := s.deletePod(t, warm.name); err != nil {
			t.Fatal(err)
		}
	}
	if quiet, busy := waitQuiet(time.Minute); !quiet {
		t.Logf("the node was not quiet a minute after the warm-up pods (%s); the storms start anyway", busy)
	}
	var p95s, floorP95s []float64 // ours / Istio's and the floor / Istio's, by round
	for r := range rounds {
		order := slices.Clone(agents)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		got := map[string]*stormResult{}
		for _, a := range order {
			got[a.name] = s.storm(t, a, pods, proxyConfig)
		}
		ours, istio := got["meshagent"], got["istio"]
		names := make([]string, len(order))
		for i, a := range order {
			names[i] = a.name
		}
		printStormTable(t, pods, fmt.Sprintf("round %d of %d, in the order %s", r+1, rounds, strings.Join(names, ", ")), ours, istio, got["floor"])
		p95s = append(p95s, quantile(ours.ready, 0.95).Seconds()/quantile(istio.ready, 0.95).Seconds())
		if floor {
			floorP95s = append(floorP95s, quantile(got["floor"].ready, 0.95).Seconds()/quantile(istio.ready, 0.95).Seconds())
		}
	}
	if rounds > 1 {
		t.Logf("storm rounds: created → Ready p95, ours / Istio's, by round %.2f; geometric mean %.2f", p95s, geomean(p95s))
	}
	if floor {
		t.Logf("storm floor: created → Ready p95, a sidecar that costs nothing / Istio's, by round %.2f; geometric mean %.2f", floorP95s, geomean(floorP95s))
	}
}

// floorImage is the floor's sidecar image: testdata/floorproxy alone, as
// Istio's pilot-agent.
const floorImage = "localhost/floorproxy:e2e"

// floorAgent loads the floor's image (floorproxy, built) on the node, and
// makes its service account.
func (s *suite) floorAgent(t *testing.T, floorproxy string) agent {
	t.Helper()
	s.n.loadBinary(t, floorImage, floorproxy, "/usr/local/bin/pilot-agent")
	s.n.mustKubectl(t, serviceAccount("sa-floor"), "apply", "-f", "-")
	return agent{name: "floor", image: floorImage, floor: true}
}

// stormResult is one agent's storm.
type stormResult struct {
	ready           []time.Duration // created → Ready, per pod
	readyAll        time.Duration   // the last pod's
	csrs, csrErrors float64         // at istiod's CA, during the start
	certificate     []time.Duration // the sidecar container started → its certificate line, per pod
	agentReady      []time.Duration // the sidecar container started → its ready line, per pod
	// After the agent is ready (between): its ready line → the
	// application container started → the pod Ready, and the sidecar
	// container started → the application's; per pod, sorted.
	readyToApp, appToReady, sidecarToApp []time.Duration
	// Before the agent runs (startPhases): created → istio-init's last log
	// line, created → the sidecar container started; per pod, sorted.
	toInitDone, toSidecar []time.Duration
	workingSet            float64         // sum of the istio-proxy containers', bytes
	cpu                   float64         // sum of the istio-proxy containers' CPU, seconds, 20 s after the last Ready
	gone                  time.Duration   // delete → all gone
	quiet                 time.Duration   // delete → the node quiet again (waitQuiet)
	restarts              int             // of any container of the pods
	timeouts              []string        // certificate or xDS timeouts in the sidecars' logs, at start
	synced                []time.Duration // istiod restarted → each pod synced again
	syncedAll             time.Duration
	unready               int             // Ready → not Ready transitions while istiod was away
	reconnectLogs         []string        // the same grep: lines new since the start
	reconnects            []time.Duration // istiod restarted → each pod's first ADS stream at it, sorted
	// The clients of the outage (stormoutage_test.go): requests on
	// connections opened before istiod went, and a name made while it was
	// away.
	outageOK, outageFailed int
	brokenConns            int             // connections the clients had to open again
	outageFailures         []string        // the first few
	nameCurrent            []time.Duration // istiod restarted → the name resolved, per client pod
	namesMissing           int
}

// storm creates the pods of one agent at once, measures them, restarts
// istiod under them, and deletes them.
func (s *suite) storm(t *testing.T, a agent, pods int, proxyConfig string) *stormResult {
	n := s.n
	r := &stormResult{}
	label := "storm-" + a.name
	w := n.watchPods(t, label)
	defer w.stop()

	var manifests []string
	for i := range pods {
		// The injector requests 100m of CPU per sidecar: the node's 2
		// cores would schedule 20 pods at most. 10m lets 30 and more in;
		// a request only weighs the container's CPU shares, the same for
		// both agents.
		p := podSpec{name: fmt.Sprintf("%s-%d", label, i), app: label, serviceAccount: "sa-" + a.name,
			proxyImage: a.image, native: true, proxyCPU: "10m", proxyConfig: proxyConfig}
		if i == 0 {
			// One pod of each agent logs at debug, with the kubelet's
			// timestamps: where its start's time goes, step by step
			// (keepSidecarLog keeps every pod's log).
			p.agentLogLevel = "default:debug"
		}
		manifests = append(manifests, p.manifest(n))
	}
	// The image on the node first, as for a scale-up on a node that runs
	// it already: the storm measures the pods, not the pull.
	if !a.floor {
		n.pull(t, a.image)
	}
	csrBefore, errBefore := s.csrCounts(t)
	start := time.Now()
	n.mustKubectl(t, strings.Join(manifests, "---\n"), "apply", "-f", "-")
	if !w.waitReady(pods, 10*time.Minute) {
		t.Fatalf("%s: %d of %d pods Ready after 10 minutes", a.name, len(w.readyTimes()), pods)
	}
	for _, at := range w.readyTimes() {
		r.ready = append(r.ready, at.Sub(start))
	}
	slices.Sort(r.ready)
	r.readyAll = r.ready[len(r.ready)-1]
	csrAfter, errAfter := s.csrCounts(t)
	r.csrs, r.csrErrors = csrAfter-csrBefore, errAfter-errBefore
	t.Logf("%s: %d pods Ready, the last %v after the create; %v CSRs at istiod (%v failed)", a.name, pods, r.readyAll.Round(100*time.Millisecond), r.csrs, r.csrErrors)
	s.setUIDs(t, label)
	logs := s.sidecarLogs(label, pods)
	r.timeouts = sidecarTimeouts(label, pods, logs)
	if !a.floor {
		starts, apps := s.containerStarts(t, label, "istio-proxy"), s.containerStarts(t, label, "app")
		agentReady := firstMatch(logs, readyLine)
		r.toInitDone, r.toSidecar = s.startPhases(label, pods, start, starts)
		r.certificate = between(starts, firstMatch(logs, certificateLine))
		r.agentReady = between(starts, agentReady)
		r.sidecarToApp, r.readyToApp, r.appToReady = between(starts, apps), between(agentReady, apps), between(apps, w.readyTimesByPod())
	}

	// The kubelet's resource metrics come from cAdvisor's housekeeping
	// (every 10-15 s): let a round pass with every pod up.
	time.Sleep(20 * time.Second)
	r.workingSet, r.cpu = s.resourceSums(t)

	// The reconnect storm: istiod away with every pod connected. The
	// floor's pods have no connection to istiod.
	if !a.floor {
		s.reconnectStorm(t, a, r, w, label, pods)
	}
	r.restarts = s.restarts(t, label)
	// The sidecars' logs once more, read once: the timeouts the reconnect
	// storm added, and the copies kept.
	final := s.sidecarLogs(label, pods)
	if !a.floor {
		for _, l := range sidecarTimeouts(label, pods, final) {
			if !slices.Contains(r.timeouts, l) {
				r.reconnectLogs = append(r.reconnectLogs, l)
			}
		}
	}
	for pod, log := range final {
		s.keepSidecarLog(t, pod, log)
	}

	start = time.Now()
	n.mustKubectl(t, "", "-n", testNS, "delete", "pods", "-l", "app="+label, "--wait=false")
	if !w.waitGone(10 * time.Minute) {
		t.Fatalf("%s: pods left 10 minutes after the delete", a.name)
	}
	r.gone = time.Since(start)
	// The next storm starts on a quiet node: the kubelet, containerd, the
	// CNI and kube-proxy may go on tearing these pods down after the API
	// has forgotten them. (In #36's seventh session the machine was quiet
	// at the first look, 2 s after every delete.)
	quiet, busy := waitQuiet(time.Minute)
	r.quiet = time.Since(start)
	t.Logf("%s: all gone %v after the delete; the node quiet after %v (%s)", a.name, r.gone.Round(100*time.Millisecond), r.quiet.Round(100*time.Millisecond), busy)
	if !quiet {
		t.Logf("the node was not quiet a minute after the pods were gone; the next storm starts anyway")
	}
	return r
}

// Quiet, for waitQuiet: the machine's CPUs busy less than quietBusy over
// quietWindow.
const (
	quietWindow = 2 * time.Second
	quietBusy   = 0.25
)

// waitQuiet waits until the machine's CPUs have been mostly idle for
// quietWindow (by /proc/stat), for at most limit, and says how busy the
// last window was.
func waitQuiet(limit time.Duration) (bool, string) {
	var last float64
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); {
		b0, t0, err0 := cpuTimes()
		time.Sleep(quietWindow)
		b1, t1, err1 := cpuTimes()
		if err := errors.Join(err0, err1); err != nil || t1 <= t0 {
			return false, fmt.Sprintf("the CPUs' times unknown: %v", err)
		}
		last = (b1 - b0) / (t1 - t0)
		if last < quietBusy {
			return true, fmt.Sprintf("%.0f %% busy over %v", 100*last, quietWindow)
		}
	}
	return false, fmt.Sprintf("%.0f %% busy over the last %v", 100*last, quietWindow)
}

// cpuTimes are the machine's busy and total CPU seconds so far (procfs's
// reading of /proc/stat; idle and iowait are not busy, and guest time is
// in user and nice already).
func cpuTimes() (busy, total float64, err error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, 0, err
	}
	st, err := fs.Stat()
	if err != nil {
		return 0, 0, err
	}
	c := st.CPUTotal
	busy = c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal
	return busy, busy + c.Idle + c.Iowait, nil
}

// reconnectStorm stops istiod with every pod of the storm connected,
// starts it again 5 s later, and follows the pods until istiod's syncz
// lists each as synced. Meanwhile clients in a few pods send on
// connections opened before istiod went, and wait for a name made while
// it was away (stormoutage_test.go).
func (s *suite) reconnectStorm(t *testing.T, a agent, r *stormResult, w *podWatch, label string, pods int) {
	w.markReadyBaseline()
	o := s.startKeeps(t, label, pods)
	s.n.script(t, time.Minute, nil, filepath.Join(s.n.hack, "istio-down.sh"), "istiod")
	down := time.Now()
	s.learnName(t, o, label)
	time.Sleep(time.Until(down.Add(5 * time.Second)))
	restart := time.Now()
	up := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "bash", filepath.Join(s.n.hack, "istio-up.sh"), "istiod").CombinedOutput()
		if err != nil {
			err = fmt.Errorf("istio-up.sh istiod: %v\n%s", err, out)
		}
		up <- err
	}()
	synced := s.waitSynced(label, pods, restart, 5*time.Minute)
	if err := <-up; err != nil {
		t.Fatal(err)
	}
	for _, d := range synced {
		r.synced = append(r.synced, d)
	}
	slices.Sort(r.synced)
	if len(r.synced) < pods {
		t.Errorf("%s: %d of %d pods synced at istiod 5 minutes after its restart", a.name, len(r.synced), pods)
	}
	if len(r.synced) > 0 {
		r.syncedAll = r.synced[len(r.synced)-1]
	}
	time.Sleep(2 * time.Second)
	r.unready = w.unreadySinceBaseline()
	s.endOutage(t, o, r, restart)
	r.reconnects = s.reconnects(t, label, restart)
	if r.outageFailed > 0 || r.brokenConns > 0 {
		msg := fmt.Sprintf("%s: %d requests failed and %d connections broke while istiod was away and came back: %q", a.name, r.outageFailed, r.brokenConns, r.outageFailures)
		if a.name == "meshagent" {
			t.Error(msg) // #36: no request fails on a connection that was open
		} else {
			t.Log(msg)
		}
	}
}

// istiodMetrics scrapes istiod's monitoring port (15014, in the node's
// netns).
func (s *suite) istiodMetrics(t *testing.T) testkit.Families {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := s.n.inNetns(ctx, "curl", "-sf", "http://127.0.0.1:15014/metrics").Output()
	if err != nil {
		t.Fatalf("istiod's metrics: %v", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(out)))
	if err != nil {
		t.Fatalf("istiod's metrics: %v", err)
	}
	return fams
}

// csrCounts are istiod's CA counters: CSRs received, and those that failed
// (authentication, parsing, identity, signing). istiod has no CSR latency
// metric.
func (s *suite) csrCounts(t *testing.T) (csrs, failed float64) {
	m := s.istiodMetrics(t)
	for _, name := range []string{"citadel_server_authentication_failure_count", "citadel_server_csr_parsing_err_count",
		"citadel_server_id_extraction_err_count", "citadel_server_csr_sign_err_count"} {
		failed += testkit.MetricValue(t, m, name)
	}
	return testkit.MetricValue(t, m, "citadel_server_csr_count"), failed
}

// resourceSums are the sums of the istio-proxy containers' working sets
// (bytes) and CPU (seconds since each started: the agent's and the
// stand-in Envoy's start, then idle) in the test namespace, from the
// kubelet's resource metrics (what `kubectl top` and the eviction manager
// read).
func (s *suite) resourceSums(t *testing.T) (workingSet, cpu float64) {
	out := s.n.mustKubectl(t, "", "get", "--raw", "/api/v1/nodes/kubenode/proxy/metrics/resource")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(out))
	if err != nil {
		t.Fatalf("the kubelet's resource metrics: %v", err)
	}
	sum := func(name string) float64 {
		return testkit.MetricValue(t, testkit.Families(fams), name, "namespace", testNS, "container", "istio-proxy")
	}
	return sum("container_memory_working_set_bytes"), sum("container_cpu_usage_seconds_total")
}

// waitSynced polls istiod's syncz until every pod of the label is listed
// with its CDS and LDS acknowledged, and returns when each was first seen
// so, from since.
func (s *suite) waitSynced(label string, pods int, since time.Time, timeout time.Duration) map[string]time.Duration {
	synced := map[string]time.Duration{}
	for deadline := time.Now().Add(timeout); len(synced) < pods && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := s.n.istiodGet("/debug/syncz")
		if err != nil {
			continue
		}
		at := time.Since(since)
		var entries []struct {
			Proxy         string `json:"proxy"`
			ClusterSent   string `json:"cluster_sent"`
			ClusterAcked  string `json:"cluster_acked"`
			ListenerSent  string `json:"listener_sent"`
			ListenerAcked string `json:"listener_acked"`
		}
		if json.Unmarshal([]byte(out), &entries) != nil {
			continue
		}
		for _, e := range entries {
			if !strings.HasPrefix(e.Proxy, label+"-") || e.ClusterAcked == "" || e.ClusterAcked != e.ClusterSent || e.ListenerAcked != e.ListenerSent {
				continue
			}
			if _, ok := synced[e.Proxy]; !ok {
				synced[e.Proxy] = at
			}
		}
	}
	return synced
}

// restarts sums the restart counts of every container of the label's pods.
func (s *suite) restarts(t *testing.T, label string) int {
	out := s.n.mustKubectl(t, "", "-n", testNS, "get", "pods", "-l", "app="+label, "-o",
		`jsonpath={range .items[*]}{.status.initContainerStatuses[*].restartCount} {.status.containerStatuses[*].restartCount} {end}`)
	sum := 0
	for _, f := range strings.Fields(out) {
		v, _ := strconv.Atoi(f)
		sum += v
	}
	return sum
}
