package e2e

import (
	"crypto/x509"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
	"github.com/miekg/dns"
)

// meshagent against Istio's own istiod (../shared/peers/istiod), exactly
// as a pod runs it: the CA client gets a certificate for a CSR
// authenticated by the service-account JWT, the XDS proxy holds the TLS
// stream with Istio's root and the token, the stand-in Envoy receives
// Istio's real clusters, listeners, routes and endpoints through it and
// ACKs them, the DNS proxy answers a ServiceEntry host from NDS, and the
// agent is ready. Then a ServiceEntry is added (Envoy and DNS follow) and
// istiod restarts (the agent stays ready on its cache, reconnects and
// converges). When Istio's pilot-agent is built, it runs the same script on
// the same istiod, and both are compared. `make e2e-istiod` builds both
// peers and prints the figures.

// istiodAgent is one of the two agents under comparison.
type istiodAgent struct {
	name string
	// command runs the agent on the pod directory root (its cwd).
	command func(root string) *exec.Cmd
	// files are what the agent reads from the pod directory besides the
	// pod's own (Istio's agent: its bootstrap template), by path.
	files map[string][]byte
}

// istiodRun is what one agent did against istiod.
type istiodRun struct {
	san      string              // the workload certificate's URI SAN
	held     map[string][]string // what the stand-in held, by type
	metadata map[string]any      // the node metadata the stand-in sent
	dns      map[string]string   // DNS answers, by question
	// figures: start → /healthz/ready 200, start → the workload
	// certificate in Envoy (Istio's readiness does not wait for it: with a
	// real Envoy, clusters and listeners warm until it arrives), a new
	// ServiceEntry → Envoy and DNS, istiod's start → the agent's
	// reconnection ACKed (syncz).
	ready, cert, change, reconnect time.Duration
}

// The ServiceEntry the test adds, and the host and address it brings.
const (
	addedHost = "added.example.internal"
	addedIP   = "240.240.0.11"
	addedSE   = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: added
  namespace: ns
spec:
  hosts:
  - ` + addedHost + `
  addresses:
  - ` + addedIP + `
  ports:
  - number: 18083
    name: http
    protocol: HTTP
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints:
  - address: 127.0.0.1
`
)

// dnsQuestions are asked of both agents' DNS proxies: NDS names, a host
// without an address (not in NDS: forwarded, and the resolver is dead),
// a short name.
var dnsQuestions = []struct {
	name  string
	qtype uint16
}{
	{"backend.example.internal.", dns.TypeA},
	{"backend.example.internal.", dns.TypeAAAA},
	{addedHost + ".", dns.TypeA},
	{"noaddr.example.internal.", dns.TypeA},
	{"backend.example.internal.ns.svc.cluster.local.", dns.TypeA},
}

// Differences between the agents' node metadata allowed on purpose (the
// conformance suite's list: the version of the agent that wrote it).
var allowedMetadataDiffs = []string{"ISTIO_VERSION"}

func TestIstiodEndToEnd(t *testing.T) {
	if os.Getenv(istiodNetnsEnv) == "" {
		detail := "meshagent against Istio's istiod, Istio's agent beside it when built"
		testkit.E2ESummary(t, "istiod end-to-end (TestIstiodEndToEnd)", &detail)
		if ok, why := e2ekit.CanUseNetns(); !ok {
			detail = why
			t.Skip(why + ": istiod and the agents use fixed ports, so the test runs in its own network namespace")
		}
		istiodPeerPaths(t)
		rerunInNamespace(t)
		return
	}
	bin, run := istiodPeerPaths(t)
	peer := startIstiodPeer(t, bin, run)
	agents, istioMissing := istiodAgents(t, e2ekit.AgentBinary)
	runs := map[string]*istiodRun{}
	for i, a := range agents {
		if i > 0 {
			// The next agent meets istiod as the first did: freshly
			// started, without the ServiceEntry the test adds.
			peer.stop(t)
			_ = os.Remove(filepath.Join(peer.dir, "config", "added.yaml"))
			peer.Start(t)
		}
		ok := t.Run(a.name, func(t *testing.T) { runs[a.name] = runAgainstIstiod(t, peer, a) })
		if !ok || !t.Run(a.name+" VM renews by its certificate", func(t *testing.T) { renewsByCertificate(t, peer, a) }) {
			return
		}
	}
	for _, a := range agents {
		r := runs[a.name]
		t.Logf("figure %s: start→ready %v, start→certificate in Envoy %v, ServiceEntry change→Envoy+DNS %v, reconnect after 2 s down (from istiod's start) %v",
			a.name, r.ready.Round(time.Millisecond), r.cert.Round(time.Millisecond), r.change.Round(time.Millisecond), r.reconnect.Round(time.Millisecond))
	}
	if istioMissing != nil {
		t.Logf("no differential: %v", istioMissing)
		return
	}
	compareRuns(t, runs["meshagent"], runs["istio"])
}

// istiodAgents are the agents compared against istiod: meshagent (the
// binary ours), and Istio's pilot-agent with its bootstrap template when
// it is built (else why not).
func istiodAgents(t *testing.T, ours string) ([]istiodAgent, error) {
	t.Helper()
	agents := []istiodAgent{{name: "meshagent", command: func(root string) *exec.Cmd {
		return exec.Command(ours, "proxy", "sidecar", "--root", root, "--domain", "ns.svc.cluster.local")
	}}}
	istio, istioSrc, istioMissing := e2ekit.IstioPeer() // the source: its bootstrap template
	if istioMissing == nil {
		template, err := os.ReadFile(filepath.Join(istioSrc, e2ekit.IstioTemplateSource))
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, istiodAgent{name: "istio", command: func(string) *exec.Cmd {
			return exec.Command(istio, "proxy", "sidecar", "--domain", "ns.svc.cluster.local")
		}, files: map[string][]byte{e2ekit.IstioTemplatePath: template}})
	}
	return agents, istioMissing
}

// launchAgainstIstiod starts one agent as pod-0 in namespace ns against
// istiod, with the pod's files (the token, the mesh root, the agent's own
// files) in a directory of its own; the agent is stopped when the test
// ends. It returns the process and when it was started.
func launchAgainstIstiod(t *testing.T, peer *istiodPeer, a istiodAgent) (*e2ekit.AgentProcess, time.Time) {
	t.Helper()
	root := testkit.ShortTempDir(t, "pod")
	writePodFiles(t, peer, a, root)
	return launchIn(t, a, root)
}

// writePodFiles writes the pod's files under root: the service-account
// token and the mesh's root, named relative to the pod directory
// (meshagent reads every path under --root; Istio's agent runs in it), and
// the agent's own.
func writePodFiles(t *testing.T, peer *istiodPeer, a istiodAgent, root string) {
	t.Helper()
	b, err := os.ReadFile(peer.token)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, filepath.Join(root, istioTokenFile), b)
	if b, err = os.ReadFile(peer.rootCert()); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, filepath.Join(root, "mesh-root/root-cert.pem"), b)
	for path, content := range a.files {
		testkit.WriteFile(t, filepath.Join(root, path), content)
	}
}

// istioTokenFile is the service-account token under the pod directory.
const istioTokenFile = "var/run/secrets/tokens/istio-token"

// launchIn starts agent a in the pod directory root, with more environment
// (VAR=value) after the pod's.
func launchIn(t *testing.T, a istiodAgent, root string, env ...string) (*e2ekit.AgentProcess, time.Time) {
	t.Helper()
	cmd := a.command(root)
	cmd.Dir = root
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + root,
		fmt.Sprintf(`PROXY_CONFIG={"discoveryAddress":"127.0.0.1:15012","statusPort":15020,"proxyAdminPort":15000,`+
			`"binaryPath":%q,"terminationDrainDuration":"1s"}`, e2ekit.EnvoyBinary),
		// The CA is the discovery address (no CA_ADDR): istiod's
		// certificate names istiod.istio-system.svc and localhost, no IP,
		// and Istio checks ISTIOD_SAN for the CA only then.
		"ISTIOD_SAN=istiod.istio-system.svc",
		"XDS_ROOT_CA=./mesh-root/root-cert.pem", "CA_ROOT_CA=./mesh-root/root-cert.pem",
		"JWT_POLICY=third-party-jwt",
		"POD_NAME=pod-0", "POD_NAMESPACE=ns", "INSTANCE_IP=127.0.0.1", "SERVICE_ACCOUNT=default",
		"ISTIO_META_DNS_CAPTURE=true", "ISTIO_META_CLUSTER_ID=Kubernetes", "ISTIO_META_NAMESPACE=ns",
	}
	cmd.Env = append(cmd.Env, env...)
	log := &testkit.LogBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &e2ekit.AgentProcess{Cmd: cmd, Base: "http://127.0.0.1:15020", Stderr: log, Exited: make(chan error, 1), Root: root, AdminPort: 15000}
	go func() { p.Exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.Exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-p.Exited
		}
		if t.Failed() || os.Getenv("MESHAGENT_ISTIOD_LOGS") != "" {
			t.Logf("%s log (tail):\n%s", a.name, shortLines(e2ekit.Tail(log.String(), 80), 400))
		}
		if dir := os.Getenv("MESHAGENT_ISTIOD_LOGS"); filepath.IsAbs(dir) {
			// A directory: the whole log, for a trace of the start path.
			_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.log", a.name, cmd.Process.Pid)), []byte(log.String()), 0o644)
		}
		// Both agents use the same fixed ports: the next one waits for them.
		testkit.WaitFor(t, "the agent's ports to close", func() bool { return !dialable("127.0.0.1:15020") && !dialable("127.0.0.1:15000") })
	})
	return p, start
}

// runAgainstIstiod runs one agent as pod-0 in namespace ns against istiod
// and checks the whole chain, then a config change and an istiod restart.
func runAgainstIstiod(t *testing.T, peer *istiodPeer, a istiodAgent) *istiodRun {
	r := &istiodRun{dns: map[string]string{}}
	p, start := launchAgainstIstiod(t, peer, a)
	p.WaitStatus(t, "/healthz/ready", 200)
	r.ready = time.Since(start)
	envoy := standIn{admin: "http://127.0.0.1:15000"}

	// Identity: istiod's CA signed the workload certificate Envoy holds
	// (Istio's readiness does not wait for it: Envoy's SDS may be later).
	testkit.WaitFor(t, "the workload certificate in Envoy", func() bool {
		return envoy.dump(t).Secret("default") != nil
	})
	r.cert = time.Since(start)
	d := envoy.dump(t)
	r.san = checkWorkloadCert(t, d, peer.rootCert())
	if want := "spiffe://cluster.local/ns/ns/sa/default"; r.san != want {
		t.Fatalf("workload certificate SAN %q, want %q", r.san, want)
	}

	// Envoy holds what istiod says it pushed to this proxy, and ACKed it.
	r.held = waitConverged(t, peer, envoy)
	r.metadata = d.Bootstrap().GetBootstrap().GetNode().GetMetadata().AsMap()
	checkACKed(t, envoy)
	// istioctl's tables, read inside the pod, hold what Envoy holds (#22).
	checkProxyConfigTables(t, "127.0.0.1:15000")

	// DNS from NDS. Istio's agent asks for NDS on Envoy's first LDS
	// request, as ours does; readiness waits for the first table.
	if got := askDNS(t, "backend.example.internal.", dns.TypeA); got != "NOERROR aa [240.240.0.10]" {
		t.Fatalf("backend.example.internal A: %s, want 240.240.0.10 from NDS", got)
	}

	// A new ServiceEntry: Envoy gets its cluster, DNS its address.
	changed := time.Now()
	peer.writeConfig(t, "added.yaml", addedSE)
	cluster := "outbound|18083||" + addedHost
	testkit.WaitFor(t, "the new ServiceEntry in Envoy and DNS", func() bool {
		return slices.Contains(envoy.dump(t).held()[typeURLCluster], cluster) &&
			askDNS(t, addedHost+".", dns.TypeA) == "NOERROR aa ["+addedIP+"]"
	})
	r.change = time.Since(changed)
	r.held = waitConverged(t, peer, envoy)
	for _, q := range dnsQuestions {
		r.dns[q.name+" "+dns.TypeToString[q.qtype]] = askDNS(t, q.name, q.qtype)
	}

	// istiod restarts: 2 s down. The agent stays ready on what Envoy
	// holds, DNS keeps answering from the last table; then it reconnects
	// (istiod's syncz lists the proxy again) and converges.
	peer.stop(t)
	down := time.Now()
	for time.Since(down) < 2*time.Second {
		if code, body := p.Get("/healthz/ready"); code != 200 {
			t.Fatalf("/healthz/ready %d %q while istiod is down, want 200 (Envoy holds its configuration)", code, body)
		}
		if got := askDNS(t, "backend.example.internal.", dns.TypeA); got != "NOERROR aa [240.240.0.10]" {
			t.Fatalf("DNS while istiod is down: %s", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	restarted := time.Now()
	peer.Start(t)
	testkit.WaitFor(t, "the agent to reconnect to the restarted istiod", istiodSees)
	r.reconnect = time.Since(restarted)
	if held := waitConverged(t, peer, envoy); !reflect.DeepEqual(held, r.held) {
		t.Fatalf("after istiod's restart Envoy holds\n%v\nbefore\n%v", held, r.held)
	}
	checkACKed(t, envoy)
	p.WaitStatus(t, "/healthz/ready", 200)
	return r
}

// checkWorkloadCert finds the "default" secret Envoy got over SDS,
// verifies it against the mesh root and returns its URI SAN.
func checkWorkloadCert(t *testing.T, d standInDump, rootFile string) string {
	t.Helper()
	secret := d.Secret("default")
	if secret == nil {
		t.Fatal("Envoy has no workload certificate (SDS \"default\")")
	}
	chainPEM := secret.GetTlsCertificate().GetCertificateChain().GetInlineBytes()
	chain, err := pki.ParseChain(chainPEM)
	if err != nil {
		t.Fatal(err)
	}
	rootPEM, err := os.ReadFile(rootFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(rootPEM)
	if len(chain) == 0 {
		t.Fatal("empty workload certificate chain")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("the workload certificate is not istiod's CA's: %v", err)
	}
	if len(chain[0].URIs) != 1 {
		t.Fatalf("workload certificate URIs %v", chain[0].URIs)
	}
	return chain[0].URIs[0].String()
}

// waitConverged waits until the stand-in holds exactly what istiod says it
// pushed to the proxy, and returns it.
func waitConverged(t *testing.T, peer *istiodPeer, envoy standIn) map[string][]string {
	t.Helper()
	var held, pushed map[string][]string
	deadline := time.Now().Add(testkit.Timeout)
	for {
		held, pushed = envoy.dump(t).held(), peer.pushed(t)
		same := len(pushed[typeURLCluster]) > 0 && len(pushed[typeURLListener]) > 0 // connected, pushed
		for typ, names := range pushed {
			same = same && slices.Equal(held[typ], names)
		}
		if same {
			return held
		}
		if time.Now().After(deadline) {
			t.Fatalf("Envoy holds\n%v\nistiod pushed\n%v\nistiod's config_dump:\n%.3000s", held, pushed,
				mustGet(t, istiodDebug+"/debug/config_dump?proxyID="+istiodProxyID))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkACKed: Envoy accepted every type it was sent, rejected none.
func checkACKed(t *testing.T, envoy standIn) {
	t.Helper()
	stats := envoy.stats(t)
	for _, prefix := range []string{"cluster_manager.cds.", "listener_manager.lds.", "cluster_manager.eds.", "http.rds."} {
		if stats[prefix+"update_success"] == 0 || stats[prefix+"update_rejected"] != 0 {
			t.Fatalf("Envoy's %supdate_success %d, update_rejected %d: want ACKed, none rejected", prefix,
				stats[prefix+"update_success"], stats[prefix+"update_rejected"])
		}
	}
}

// istiodSees reports whether istiod has the proxy connected and its
// clusters and listeners ACKed (its syncz).
func istiodSees() bool {
	acked := syncedProxies()[istiodProxyID]
	return slices.Contains(acked, "cluster") && slices.Contains(acked, "listener")
}

// askDNS asks the DNS proxy on 127.0.0.1:15053 and describes the answer:
// rcode, flags (aa, ra), the addresses sorted.
func askDNS(t *testing.T, name string, qtype uint16) string {
	t.Helper()
	m := new(dns.Msg).SetQuestion(name, qtype)
	c := &dns.Client{Timeout: 5 * time.Second}
	resp, _, err := c.Exchange(m, "127.0.0.1:15053")
	if err != nil {
		return "error: " + err.Error()
	}
	var flags, addrs []string
	if resp.Authoritative {
		flags = append(flags, "aa")
	}
	if resp.RecursionAvailable {
		flags = append(flags, "ra")
	}
	for _, rr := range resp.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			addrs = append(addrs, rr.A.String())
		case *dns.AAAA:
			addrs = append(addrs, rr.AAAA.String())
		case *dns.CNAME:
			addrs = append(addrs, "CNAME "+rr.Target)
		}
	}
	slices.Sort(addrs)
	return strings.TrimSpace(fmt.Sprintf("%s %s %v", dns.RcodeToString[resp.Rcode], strings.Join(flags, " "), addrs))
}

// compareRuns is the differential: same identity, same resources
// received, same DNS answers, same node metadata but for the allowed.
func compareRuns(t *testing.T, ours, istio *istiodRun) {
	t.Helper()
	if ours.san != istio.san {
		t.Errorf("SAN: meshagent %q, Istio %q", ours.san, istio.san)
	}
	if !reflect.DeepEqual(ours.held, istio.held) {
		t.Errorf("resources received:\nmeshagent %v\nIstio     %v", ours.held, istio.held)
	}
	for _, q := range slices.Sorted(maps.Keys(istio.dns)) {
		if ours.dns[q] != istio.dns[q] {
			t.Errorf("DNS %s: meshagent %q, Istio %q", q, ours.dns[q], istio.dns[q])
		}
	}
	keys := map[string]bool{}
	for k := range ours.metadata {
		keys[k] = true
	}
	for k := range istio.metadata {
		keys[k] = true
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if slices.Contains(allowedMetadataDiffs, k) {
			continue
		}
		if !reflect.DeepEqual(ours.metadata[k], istio.metadata[k]) {
			t.Errorf("node metadata %s: meshagent %v, Istio %v", k, ours.metadata[k], istio.metadata[k])
		}
	}
	t.Logf("differential: SAN, %d resource types, %d DNS answers and %d node metadata keys equal (allowed differences: %v)",
		len(istio.held), len(istio.dns), len(keys)-len(allowedMetadataDiffs), allowedMetadataDiffs)
}
