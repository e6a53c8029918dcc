// Package kube runs the sidecar in real pods (#20): a real single-node
// Kubernetes (../shared/peers/kube), Istio's istiod on it with its CRDs, mesh
// and injector configuration rendered from Istio's own charts, and pods
// injected by Istio's webhook, unmodified, once with meshagent as the image's
// pilot-agent and once with Istio's own (the oracle). Every check is a named
// subtest, TestKube/<agent>/<native|init>/<check>; where Istio's agent passes
// a check ours must pass it too, and where Istio's agent fails it, our result
// is reported beside it rather than failing the suite.
//
// The short form (the default; `make test`) runs one injected pod of ours as
// a native sidecar: Ready through the kubelet's probes, istiod's certificate,
// syncz, the pilot-agent commands, the delete order. MESHAGENT_KUBE=full (`make e2e-kube`) runs every check,
// for both agents and both injection modes, and prints the figures.
//
// Root only (a network namespace, cgroups, mounts); the node's and Istio's
// binaries must be built (`make test` builds them): missing ones fail the test.
package kube

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// agent is one sidecar image under test.
type agent struct {
	name   string // "meshagent", or "istio" for the oracle
	image  string // the reference in the node's registry, repo:tag
	digest string // the same image by digest, as the kubelet reports it
	oracle bool
	floor  bool // the storm's floor: a sidecar that costs nothing (testdata/floorproxy), loaded on the node, not in the registry
}

// suite holds what the checks share: the node, and each check's outcome by
// agent, so that ours is judged against the oracle's.
type suite struct {
	n    *node
	full bool

	mu      sync.Mutex
	results map[string]map[string]error  // "mode/check" -> agent -> nil or why it failed
	figures map[string]map[string]string // "mode metric" -> agent -> value
	outages int                          // the reconnect storms' names so far (learnName)
	// uids are the storm's pods by name (setUIDs): their log directories
	// are named by UID, and a pod of the same name deleted a moment before
	// may still have its own.
	uids map[string]string
}

func TestKube(t *testing.T) {
	s := &suite{full: os.Getenv("MESHAGENT_KUBE") == "full", results: map[string]map[string]error{}, figures: map[string]map[string]string{}}
	form := "short form"
	if s.full {
		form = "full"
	}
	detail := form
	testkit.E2ESummary(t, "kube suite (TestKube)", &detail)
	if ok, why := testkit.CanRoot("a network namespace, cgroups and mounts for the kube node"); !ok {
		detail = why
		t.Skip(why)
	}
	agents := s.setUp(t, s.full, "Always")
	defer func() { detail = form + ", " + s.summary() }()

	for _, a := range agents {
		t.Run(a.name, func(t *testing.T) {
			for _, mode := range s.modes() {
				t.Run(mode, func(t *testing.T) { s.runMode(t, a, mode == "native") })
			}
			if s.full {
				s.check(t, a, "", "istiod-outage", func(t *testing.T) error { return s.istiodOutage(t, a) })
			}
			if !a.oracle {
				s.check(t, a, "", "registry-no-such-image", func(t *testing.T) error { return s.noSuchImage(t, a) })
			}
		})
	}
	if s.full {
		s.canaries(t, agents)
	}
	s.report(t, agents)
}

// setUp builds the images, brings the node up, serves the registry and
// pushes the images to it, starts Istio (the injected containers'
// imagePullPolicy pullPolicy) and creates the test namespace with its
// service accounts and services; it returns the agents under test, Istio's
// (the oracle) first when withOracle.
func (s *suite) setUp(t *testing.T, withOracle bool, pullPolicy string) []agent {
	t.Helper()
	// As root the suite runs or fails: `make test` installs these (hack/install-deps.sh).
	for _, tool := range []string{"nsenter", "ctr", "curl", "yq", "jq", "dig", "iptables-nft-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (`make test` installs it: hack/install-deps.sh): %v", tool, err)
		}
	}
	n := layout(t)
	s.n = n
	n.requireBuilt(t)

	// Images first (no node needed), so a build failure costs no node.
	app := buildStatic(t, "kubeapp")
	ours := s.makeImage(t, "image")
	var oracleTar string
	if withOracle {
		oracleTar = s.makeImage(t, "image-istio")
	}

	n.up(t)
	n.loadBinary(t, appImage, app, "/kubeapp")
	reg := n.serveRegistry(t)
	var agents []agent
	if withOracle {
		digest := reg.pushTarball(t, oracleTar, oracleRepo)
		agents = append(agents, agent{name: "istio", image: reg.ref(oracleRepo), digest: digest, oracle: true})
	}
	agents = append(agents, agent{name: "meshagent", image: reg.ref(oursRepo), digest: reg.pushOurs(t, ours)})
	n.istioUp(t, reg.ref(oursRepo), pullPolicy)

	var accounts, apps []string
	for _, a := range agents {
		accounts = append(accounts, "sa-"+a.name)
		for _, mode := range s.modes() {
			apps = append(apps, "b-"+a.name+"-"+mode)
		}
	}
	n.mustKubectl(t, baseManifests(accounts, apps)+serviceEntry, "apply", "-f", "-")
	testkit.WaitFor(t, "istiod's root certificate in namespace "+testNS, func() bool {
		_, err := n.kubectl("", "-n", testNS, "get", "configmap", "istio-ca-root-cert")
		return err == nil
	})
	return agents
}

// buildStatic builds ./testdata/NAME as a static binary (one with which an
// image needs nothing else) and returns its path.
func buildStatic(t *testing.T, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	build := exec.Command("go", "build", "-o", bin, "./testdata/"+name)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", name, err, out)
	}
	return bin
}

// summary counts each agent's passed checks, for make test's last lines.
func (s *suite) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	passed, ran := map[string]int{}, map[string]int{}
	for _, byAgent := range s.results {
		for name, err := range byAgent {
			ran[name]++
			if err == nil {
				passed[name]++
			}
		}
	}
	var out []string
	for _, name := range []string{"meshagent", "istio"} {
		if ran[name] > 0 {
			out = append(out, fmt.Sprintf("%s passed %d of %d checks", name, passed[name], ran[name]))
		}
	}
	return strings.Join(out, ", ")
}

func (s *suite) modes() []string {
	if s.full {
		return []string{"native", "init"}
	}
	return []string{"native"}
}

// makeImage runs `make image` (or image-istio) and returns the tarball, the
// last line it prints.
func (s *suite) makeImage(t *testing.T, target string) string {
	t.Helper()
	cmd := exec.Command("make", "-s", "-C", s.n.repo, target)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", target, err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	tar := strings.TrimSpace(lines[len(lines)-1])
	if _, err := os.Stat(tar); err != nil {
		t.Fatalf("make %s: its last line %q is not the image tarball: %v\n%s", target, tar, err, out)
	}
	return tar
}

// check runs one named check as a subtest and records its outcome. The
// oracle's failures are skips, not failures: they say what the stand-in
// Envoy or the node cannot show, or where Istio's agent behaves otherwise. Ours fails where the oracle passed (or was
// not run), and is skipped, saying both, where the oracle failed too.
func (s *suite) check(t *testing.T, a agent, mode, name string, fn func(t *testing.T) error) bool {
	key := strings.TrimPrefix(mode+"/"+name, "/")
	var err error
	t.Run(name, func(t *testing.T) {
		err = fn(t)
		s.mu.Lock()
		if s.results[key] == nil {
			s.results[key] = map[string]error{}
		}
		s.results[key][a.name] = err
		oracle, ran := s.results[key]["istio"]
		s.mu.Unlock()
		switch {
		case err == nil:
		case a.oracle:
			t.Skipf("Istio's agent fails %s (reported, not failed: the oracle shows what the stand-in Envoy or the node cannot): %v", key, err)
		case ran && oracle != nil:
			t.Skipf("fails, as Istio's agent does (%v): %v", oracle, err)
		default:
			t.Fatal(err)
		}
	})
	return err == nil
}

// figure records one measurement of one agent, printed beside the other
// agent's by report.
func (s *suite) figure(a agent, mode, metric, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := mode + " " + metric
	if s.figures[key] == nil {
		s.figures[key] = map[string]string{}
	}
	s.figures[key][a.name] = value
}

// report prints each check's outcome by agent, and the figures.
func (s *suite) report(t *testing.T, agents []agent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.results))
	for k := range s.results {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var cols []string
		for _, a := range agents {
			err, ran := s.results[k][a.name]
			switch {
			case !ran:
				cols = append(cols, a.name+"=not-run")
			case err == nil:
				cols = append(cols, a.name+"=pass")
			default:
				cols = append(cols, fmt.Sprintf("%s=FAIL (%v)", a.name, firstLine(err.Error())))
			}
		}
		t.Logf("check %-32s %s", k, strings.Join(cols, "  "))
	}
	keys = keys[:0]
	for k := range s.figures {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var cols []string
		for i := len(agents) - 1; i >= 0; i-- { // ours first, Istio's beside it
			if v, ok := s.figures[k][agents[i].name]; ok {
				cols = append(cols, agents[i].name+" "+v)
			}
		}
		t.Logf("figure %-40s %s", k, strings.Join(cols, "   "))
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// serviceEntry is a name only the mesh knows (no Kubernetes Service, so
// CoreDNS answers NXDOMAIN for it): it resolves only through the sidecar's
// DNS proxy, from istiod's name table (NDS).
const serviceEntry = `---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: mesh-only, namespace: ` + testNS + `}
spec:
  hosts: [mesh-only.e2e.internal]
  addresses: [240.240.20.20]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.244.0.250}]
`

var meshOnlyHost, meshOnlyIP = "mesh-only.e2e.internal", "240.240.20.20"

// timeFormat is how the suite prints durations in figures.
func secs(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }
