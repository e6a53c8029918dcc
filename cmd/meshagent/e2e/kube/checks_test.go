package kube

// The checks, each against what the kubelet, the API server and istiod do
// with an injected pod (#20).

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/services/envoy/bootstrap"
	"github.com/meshagent/meshagent/testdata/testkit/envoyadmin"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// runMode runs the checks on pods of one agent in one injection mode:
// native (istio-proxy an init container with restartPolicy Always) or init
// (istio-proxy a regular container). Both have Istio's istio-init container
// running `pilot-agent istio-iptables` (no Istio CNI plugin on the node).
func (s *suite) runMode(t *testing.T, a agent, native bool) {
	mode := "init"
	if native {
		mode = "native"
	}
	spec := func(role string) podSpec {
		return podSpec{name: role + "-" + a.name + "-" + mode, app: role + "-" + a.name + "-" + mode, serviceAccount: "sa-" + a.name,
			proxyImage: a.image, native: native, appDrain: 2 * time.Second}
	}
	podA, podB := spec("a"), spec("b")
	if s.full {
		// While A drains it still calls B through both sidecars: the
		// sidecar must carry it until the app has exited (istio#60649).
		podA.drainGet = "http://" + podB.app + ":8080/"
	}
	var ready time.Duration
	if !s.check(t, a, mode, "ready", func(t *testing.T) (err error) {
		ready, err = s.injectedReady(t, podA, native)
		return err
	}) {
		return
	}
	s.figure(a, mode, "created->Ready", secs(ready))
	s.check(t, a, mode, "pulled-from-registry", func(t *testing.T) error { return s.pulled(t, podA.name, a) })
	s.check(t, a, mode, "certificate", func(t *testing.T) error { return s.certificate(t, podA.name, podA.serviceAccount) })
	s.check(t, a, mode, "syncz", func(t *testing.T) error { return s.syncz(t, podA.name) })
	if !a.oracle { // Istio's image: pilot-agent is the entrypoint, PID 1
		s.check(t, a, mode, "process-tree", func(t *testing.T) error { return s.processTree(t, podA.name) })
		s.check(t, a, mode, "probe-answered-by-envoy", func(t *testing.T) error { return s.probeInEnvoy(t, podA.name) })
	}
	s.check(t, a, mode, "pilot-agent-commands", func(t *testing.T) error { return s.agentCommands(t, podA.name) })
	if s.full {
		if _, err := s.injectedReady(t, podB, native); err != nil {
			t.Fatalf("second pod: %v", err)
		}
		s.check(t, a, mode, "dns-proxy", func(t *testing.T) error { return s.dnsProxy(t, podA.name, podB.app) })
		s.check(t, a, mode, "a-to-b-captured", func(t *testing.T) error { return s.aToB(t, podA.name, podB.name, podB.app) })
		if mem, stat, err := s.workingSet(t, podA.name, "istio-proxy"); err == nil {
			s.figure(a, mode, "istio-proxy working set", mib(mem))
			// What the working set is made of: anonymous memory, tmpfs
			// (the Memory-medium emptyDir at /etc/istio/proxy) and the
			// page cache the kernel counts as active.
			s.figure(a, mode, "  anon / shmem / active file", mib(stat["total_rss"])+" / "+mib(stat["total_shmem"])+" / "+mib(stat["total_active_file"]))
			s.logProxyDir(t, podA.name)
		} else {
			t.Logf("memory of %s: %v", podA.name, err)
		}
		// The working set counts the container's page cache too; the
		// agent's own RSS says how much of it is the agent.
		for _, comm := range []string{"pilot-agent", "envoy"} {
			if rss, anon, err := s.processRSS(t, podA.name, "istio-proxy", comm); err == nil {
				s.figure(a, mode, comm+" RSS (anon)", mib(rss)+" ("+mib(anon)+")")
			} else {
				t.Logf("RSS of %s's %s: %v", podA.name, comm, err)
			}
		}
		s.check(t, a, mode, "envoy-killed-restarted-in-place", func(t *testing.T) error { return s.envoyKilled(t, podA.name) })
	}
	s.check(t, a, mode, "delete-order", func(t *testing.T) error {
		gone, err := s.deleteInOrder(t, podA.name, native, podA.drainGet != "")
		if gone > 0 {
			s.figure(a, mode, "delete->gone", secs(gone))
		}
		return err
	})
	if !s.full {
		return
	}
	// A proxy that never connects never turns ready; it must still stop at
	// once, not after its drain duration (istio#51883).
	s.check(t, a, mode, "never-ready-exits-at-once", func(t *testing.T) error {
		p := spec("never")
		p.proxyConfig = `{"discoveryAddress":"istiod-nowhere.istio-system.svc:15012","terminationDrainDuration":"20s"}`
		return s.quickExit(t, p, false)
	})
	// EXIT_ON_ZERO_ACTIVE_CONNECTIONS: with no connection left the sidecar
	// exits after MINIMUM_DRAIN_DURATION, long before the drain duration.
	s.check(t, a, mode, "exit-on-zero-connections", func(t *testing.T) error {
		p := spec("zero")
		p.appDrain = 0
		p.proxyConfig = `{"terminationDrainDuration":"20s","proxyMetadata":{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":"true","MINIMUM_DRAIN_DURATION":"2s"}}`
		return s.quickExit(t, p, true)
	})
	if !native {
		// ... and not before: a connection still open holds the sidecar
		// until it closes. Init mode only: in native mode the injector's
		// preStop drain makes both agents exit at SIGTERM regardless.
		s.check(t, a, mode, "exit-on-zero-waits-for-connection", func(t *testing.T) error {
			p := spec("hold")
			p.appDrain = 12 * time.Second
			p.proxyConfig = `{"terminationDrainDuration":"25s","proxyMetadata":{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":"true","MINIMUM_DRAIN_DURATION":"2s"}}`
			return s.exitWaitsForConnection(t, p, podB.name)
		})
	}
}

// injectedReady creates the pod and checks what Istio's webhook made of it
// and that the kubelet's own probes turned it Ready.
func (s *suite) injectedReady(t *testing.T, p podSpec, native bool) (time.Duration, error) {
	took, err := s.n.createReady(t, p, 3*time.Minute)
	if err != nil {
		return 0, err
	}
	got := s.n.getPod(t, p.name)
	proxy, isNative, ok := got.proxy()
	switch {
	case !ok:
		return 0, errors.New("no istio-proxy container: Istio's webhook did not inject the pod")
	case isNative != native:
		return 0, fmt.Errorf("istio-proxy native=%v, want %v", isNative, native)
	case proxy.Image != p.proxyImage:
		return 0, fmt.Errorf("istio-proxy image %q, want %q", proxy.Image, p.proxyImage)
	case proxy.StartupProbe == nil || proxy.StartupProbe.HTTPGet == nil || fmt.Sprint(proxy.StartupProbe.HTTPGet.Port) != "15021":
		return 0, fmt.Errorf("istio-proxy has no startup probe on 15021: %+v", proxy.StartupProbe)
	}
	if init, ok := got.container("istio-init"); !ok || len(init.Args) == 0 || init.Args[0] != "istio-iptables" {
		return 0, fmt.Errorf("no istio-init container running istio-iptables: %+v", init)
	}
	if native && (proxy.Lifecycle == nil || proxy.Lifecycle.PreStop == nil || proxy.Lifecycle.PreStop.Exec == nil ||
		!strings.Contains(strings.Join(proxy.Lifecycle.PreStop.Exec.Command, " "), "pilot-agent request")) {
		return 0, fmt.Errorf("native istio-proxy without the injector's preStop drain: %+v", proxy.Lifecycle)
	}
	app, _ := got.container("app")
	if app.ReadinessProbe == nil || app.ReadinessProbe.HTTPGet == nil || !strings.HasPrefix(app.ReadinessProbe.HTTPGet.Path, "/app-health/app/") {
		return 0, fmt.Errorf("the app's readiness probe was not rewritten to the agent's /app-health/: %+v", app.ReadinessProbe)
	}
	// Both containers ready, none restarted. Read until both say ready, for
	// a few seconds: once (make test, 2026-11-29) the kubelet logged a
	// readiness result of "not ready" and "ready" again a millisecond
	// apart with the agent ready throughout (its log), and a single read
	// right after the pod turned Ready caught istio-proxy ready=false.
	var why error
	for deadline := time.Now().Add(10 * time.Second); ; got = s.n.getPod(t, p.name) {
		why = nil
		for _, c := range []string{"istio-proxy", "app"} {
			st, _ := got.status(c)
			if st.RestartCount != 0 {
				return 0, fmt.Errorf("%s: ready=%v restarts=%d", c, st.Ready, st.RestartCount)
			}
			if !st.Ready && why == nil {
				why = fmt.Errorf("%s: ready=%v restarts=%d", c, st.Ready, st.RestartCount)
			}
		}
		if why == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return took, why
}

// certificate reads the workload certificate the sidecar's Envoy holds (the
// stand-in's config_dump lists the SDS secrets it was sent) through
// `pilot-agent request`, as a user would, and checks it against istiod's
// root in the namespace and the pod's service account.
func (s *suite) certificate(t *testing.T, pod, sa string) error {
	// What the agent sent istiod's CA: the injector's istio-token volume, a
	// projected token for audience istio-ca, which the CA checks with a
	// TokenReview (istiod has no other JWT authenticator here).
	if aud := s.n.getPod(t, pod).tokenAudiences()["istio-token"]; aud != "istio-ca" {
		return fmt.Errorf("no istio-token volume projecting a token for audience istio-ca (got %q)", aud)
	}
	var chain []byte
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := s.n.exec(pod, "istio-proxy", "pilot-agent", "request", "GET", "config_dump")
		var dump *envoyadmin.Dump
		if err == nil {
			dump, err = envoyadmin.Decode([]byte(out))
		}
		if err == nil {
			if sec := dump.Secret("default"); sec != nil {
				chain = sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes()
				break
			}
			err = errors.New("no SDS secret \"default\" in Envoy's config_dump")
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Second)
	}
	certs, err := pki.ParseChain(chain)
	if err != nil {
		return err
	}
	if len(certs) == 0 {
		return fmt.Errorf("no certificate in the secret: %q", chain)
	}
	want := fmt.Sprintf("spiffe://cluster.local/ns/%s/sa/%s", testNS, sa)
	var sans []string
	for _, u := range certs[0].URIs {
		sans = append(sans, u.String())
	}
	if len(sans) != 1 || sans[0] != want {
		return fmt.Errorf("certificate SANs %v, want [%s]", sans, want)
	}
	root := s.n.mustKubectl(t, "", "-n", testNS, "get", "configmap", "istio-ca-root-cert", "-o", "jsonpath={.data.root-cert\\.pem}")
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(root)) {
		return fmt.Errorf("istio-ca-root-cert holds no certificate: %q", root)
	}
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("the workload certificate does not chain to istiod's root: %w", err)
	}
	t.Logf("workload certificate %s, issued by %q, valid until %s", want, certs[0].Issuer, certs[0].NotAfter.Format(time.RFC3339))
	return nil
}

// agentCommands runs, in the sidecar container, the pilot-agent commands
// Istio's injector, hooks and tools run by name: --help, istio-iptables
// --help, wait (returns once the proxy is ready), request.
func (s *suite) agentCommands(t *testing.T, pod string) error {
	for _, cmd := range [][]string{
		{"pilot-agent", "--help"},
		{"pilot-agent", "istio-iptables", "--help"},
		{"pilot-agent", "wait", "--timeoutSeconds", "10"},
		{"pilot-agent", "request", "GET", "server_info"},
	} {
		out, err := s.n.exec(pod, "istio-proxy", cmd...)
		if err != nil {
			return fmt.Errorf("%s: %v (%.300q)", strings.Join(cmd, " "), err, out)
		}
	}
	return nil
}

// probeInEnvoy: the Ready pod's Envoy answers the kubelet's probes on
// :15021 itself, the agent having set meshagent.agent_ready to 100 (#36).
func (s *suite) probeInEnvoy(t *testing.T, pod string) error {
	var last string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := s.n.exec(pod, "istio-proxy", "pilot-agent", "request", "GET", "runtime")
		if err != nil {
			return fmt.Errorf("pilot-agent request GET runtime: %v (%.300q)", err, out)
		}
		v, err := envoyadmin.RuntimeValue([]byte(out), bootstrap.ReadinessKey)
		if err != nil {
			return fmt.Errorf("Envoy's /runtime: %v: %.300s", err, out)
		}
		if last = v; last == "100" {
			return nil
		}
	}
	return fmt.Errorf("Envoy's %s = %q, want 100 in a Ready pod", bootstrap.ReadinessKey, last)
}

// syncz waits until istiod's /debug/syncz lists the pod's proxy with every
// type it sent acknowledged.
func (s *suite) syncz(t *testing.T, pod string) error {
	id := pod + "." + testNS
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		out, err := s.n.istiodGet("/debug/syncz")
		if err != nil {
			last = err.Error()
			continue
		}
		var entries []map[string]any
		if err := json.Unmarshal([]byte(out), &entries); err != nil {
			return fmt.Errorf("/debug/syncz: %v: %.300s", err, out)
		}
		for _, e := range entries {
			if e["proxy"] != id {
				continue
			}
			last = fmt.Sprintf("cluster sent %v acked %v, listener sent %v acked %v", e["cluster_sent"], e["cluster_acked"], e["listener_sent"], e["listener_acked"])
			if e["cluster_acked"] != nil && e["cluster_acked"] != "" && e["cluster_acked"] == e["cluster_sent"] &&
				e["listener_acked"] != nil && e["listener_acked"] == e["listener_sent"] {
				t.Logf("istiod syncz %s: %s", id, last)
				return nil
			}
		}
	}
	return fmt.Errorf("istiod's /debug/syncz does not show %s synced: %s", id, last)
}

// dnsProxy resolves, from the app container, a name only istiod's name table
// has, and a Kubernetes service name.
func (s *suite) dnsProxy(t *testing.T, pod, svc string) error {
	out, err := s.n.exec(pod, "app", "/kubeapp", "resolve", meshOnlyHost)
	if err != nil || strings.TrimSpace(out) != meshOnlyIP {
		return fmt.Errorf("%s from the app: %q, %v (want %s, from the mesh's name table)", meshOnlyHost, out, err, meshOnlyIP)
	}
	ip := strings.TrimSpace(s.n.mustKubectl(t, "", "-n", testNS, "get", "service", svc, "-o", "jsonpath={.spec.clusterIP}"))
	name := svc + "." + testNS + ".svc.cluster.local"
	if out, err := s.n.exec(pod, "app", "/kubeapp", "resolve", name); err != nil || strings.TrimSpace(out) != ip {
		return fmt.Errorf("%s from the app: %q, %v (want %s)", name, out, err, ip)
	}
	return nil
}

// aToB: app A calls app B by its service name; both sidecars' captures
// count it (the NAT rules' packet counters in each pod's network namespace)
// and B's app sees the connection come from its own sidecar, not from A.
func (s *suite) aToB(t *testing.T, a, b, svc string) error {
	beforeA, err := s.redirected(t, a, "ISTIO_REDIRECT")
	if err != nil {
		return err
	}
	beforeB, err := s.redirected(t, b, "ISTIO_IN_REDIRECT")
	if err != nil {
		return err
	}
	out, err := s.n.exec(a, "app", "/kubeapp", "get", "http://"+svc+":8080/")
	if err != nil {
		return fmt.Errorf("A -> B: %v (%q)", err, out)
	}
	if !strings.HasPrefix(out, b+" says hello") {
		return fmt.Errorf("A -> B answered %q", out)
	}
	afterA, _ := s.redirected(t, a, "ISTIO_REDIRECT")
	afterB, _ := s.redirected(t, b, "ISTIO_IN_REDIRECT")
	if afterA <= beforeA || afterB <= beforeB {
		return fmt.Errorf("not captured both ways: A's outbound redirects %d -> %d, B's inbound %d -> %d (%q)", beforeA, afterA, beforeB, afterB, out)
	}
	t.Logf("A -> B: %q; redirected outbound in A %d, inbound in B %d", strings.TrimSpace(out), afterA-beforeA, afterB-beforeB)
	return nil
}

// deleteInOrder deletes the pod and checks the kubelet's order: the app is
// told to stop first and exits; only then is the sidecar's preStop drain run
// and the sidecar signalled (native: istio#60649); the pod is gone within
// its grace period.
func (s *suite) deleteInOrder(t *testing.T, pod string, native, drainGets bool) (time.Duration, error) {
	gone, err := s.deletePod(t, pod)
	if err != nil {
		return 0, err
	}
	if gone > grace {
		return gone, fmt.Errorf("gone after %v, past its grace period %v", gone, grace)
	}
	events, counts, err := s.appEvents(pod)
	if err != nil {
		return gone, err
	}
	kills := s.kubeletKills(t, pod)
	t.Logf("app term %s exit %s; kubelet kills %v", events["app-term"].Format("15:04:05.000"), events["app-exit"].Format("15:04:05.000"), kills)
	if events["app-exit"].IsZero() {
		return gone, fmt.Errorf("the app never exited on its own: %v", events)
	}
	if drainGets {
		ok, failed := counts["drain-get-ok"], counts["drain-get-fail"]
		t.Logf("the app's calls to B while it drained: %d answered, %d failed", ok, failed)
		if ok == 0 || failed > 0 {
			return gone, fmt.Errorf("the app's calls through its sidecar while it drained: %d answered, %d failed", ok, failed)
		}
	}
	if !native {
		return gone, nil
	}
	proxyKill, ok := kills["istio-proxy"]
	switch {
	case !ok:
		return gone, fmt.Errorf("no kill of istio-proxy in the kubelet's log")
	case proxyKill.Before(events["app-exit"]):
		return gone, fmt.Errorf("the sidecar was stopped (preStop drain) at %s, before the app exited at %s", proxyKill.Format("15:04:05.000"), events["app-exit"].Format("15:04:05.000"))
	}
	if failed := s.kubeletLines(pod, "PreStop hook"); len(failed) > 0 {
		return gone, fmt.Errorf("the sidecar's preStop hook failed: %s", failed[0])
	}
	return gone, nil
}

// quickExit starts a pod and deletes it once its sidecar runs; the pod must
// be gone well before the sidecar's 20 s drain duration. ready says whether
// the pod turns Ready first.
func (s *suite) quickExit(t *testing.T, p podSpec, ready bool) error {
	if ready {
		if _, err := s.n.createReady(t, p, 3*time.Minute); err != nil {
			return err
		}
	} else {
		if _, err := s.n.kubectl(p.manifest(s.n), "apply", "-f", "-"); err != nil {
			return err
		}
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
			if st, ok := s.n.getPod(t, p.name).status("istio-proxy"); ok && st.ContainerID != "" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("istio-proxy of %s never started:\n%s", p.name, s.n.describe(p.name))
			}
		}
		time.Sleep(3 * time.Second)
		if s.n.getPod(t, p.name).ready() {
			return fmt.Errorf("%s turned Ready with no istiod to reach", p.name)
		}
	}
	gone, err := s.deletePod(t, p.name)
	if err != nil {
		return err
	}
	t.Logf("%s gone %v after its delete", p.name, gone)
	if gone > 12*time.Second {
		return fmt.Errorf("gone after %v: the sidecar waited out (most of) its 20 s drain", gone)
	}
	return nil
}

// exitWaitsForConnection deletes a pod while pod from holds a connection
// into it, through both sidecars, for 8 s: the sidecar (exit on zero active
// connections) must outlive that connection, and still exit long before its
// 25 s drain duration.
func (s *suite) exitWaitsForConnection(t *testing.T, p podSpec, from string) error {
	if _, err := s.n.createReady(t, p, 3*time.Minute); err != nil {
		return err
	}
	got := s.n.getPod(t, p.name)
	proxy, _ := got.status("istio-proxy")
	held := make(chan error, 1)
	go func() {
		_, err := s.n.exec(from, "app", "/kubeapp", "hold", got.Status.PodIP+":8080", "8s")
		held <- err
	}()
	time.Sleep(1500 * time.Millisecond) // the connection is up
	start := time.Now()
	if _, err := s.n.kubectl("", "-n", testNS, "delete", "pod", p.name, "--wait=false"); err != nil {
		return err
	}
	if _, err := s.n.kubectl("", "-n", testNS, "wait", "--for=delete", "pod/"+p.name, "--timeout=90s"); err != nil {
		return err
	}
	if err := <-held; err != nil {
		return fmt.Errorf("the held connection: %v", err)
	}
	kill, ok := s.kubeletKills(t, p.name)["istio-proxy"]
	died, ok2 := s.containerDied(p.name, proxy.ContainerID)
	if !ok || !ok2 {
		return fmt.Errorf("no kill (%v) or exit (%v) of istio-proxy in the kubelet's log", ok, ok2)
	}
	lived := died.Sub(kill)
	t.Logf("istio-proxy exited %v after its SIGTERM, the held connection closing about %v after it (pod gone after %v)", lived.Round(100*time.Millisecond), (8*time.Second - 1500*time.Millisecond - kill.Sub(start)).Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))
	switch {
	case lived < 4*time.Second:
		return fmt.Errorf("istio-proxy exited %v after its SIGTERM, with a connection still open", lived)
	case lived > 15*time.Second:
		return fmt.Errorf("istio-proxy exited %v after its SIGTERM: it waited out its drain, not the connection", lived)
	}
	return nil
}

// envoyKilled SIGKILLs the Envoy inside the sidecar container and checks it
// is restarted in place: a new Envoy process in the same container, the
// container's restart count unchanged, the pod Ready again.
func (s *suite) envoyKilled(t *testing.T, pod string) error {
	before := s.n.getPod(t, pod)
	st, _ := before.status("istio-proxy")
	old, err := s.envoyPID(t, pod)
	if err != nil {
		return err
	}
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		return err
	}
	var now int
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if p, err := s.envoyPID(t, pod); err == nil && p != old {
			now = p
			break
		}
		if time.Now().After(deadline) {
			after, _ := s.n.getPod(t, pod).status("istio-proxy")
			return fmt.Errorf("no new Envoy in the container within 45 s (restarts %d -> %d)", st.RestartCount, after.RestartCount)
		}
	}
	if _, err := s.n.kubectl("", "-n", testNS, "wait", "--for=condition=Ready", "pod/"+pod, "--timeout=60s"); err != nil {
		return err
	}
	after, _ := s.n.getPod(t, pod).status("istio-proxy")
	if after.RestartCount != st.RestartCount || after.ContainerID != st.ContainerID {
		return fmt.Errorf("the container was restarted (restarts %d -> %d)", st.RestartCount, after.RestartCount)
	}
	t.Logf("Envoy %d killed, %d runs in the same container", old, now)
	return nil
}

// istiodOutage stops istiod: the agent's pods stay Ready on the last
// configuration; once istiod is back, its syncz lists them again.
func (s *suite) istiodOutage(t *testing.T, a agent) error {
	var pods []string
	for _, mode := range s.modes() {
		pods = append(pods, "b-"+a.name+"-"+mode)
	}
	s.n.script(t, time.Minute, nil, filepath.Join(s.n.hack, "istio-down.sh"), "istiod")
	restarted := false
	defer func() {
		if !restarted {
			s.n.script(t, 3*time.Minute, nil, filepath.Join(s.n.hack, "istio-up.sh"), "istiod")
		}
	}()
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Second) {
		for _, p := range pods {
			if !s.n.getPod(t, p).ready() {
				return fmt.Errorf("%s turned unready with istiod down", p)
			}
		}
	}
	s.n.script(t, 3*time.Minute, nil, filepath.Join(s.n.hack, "istio-up.sh"), "istiod")
	restarted = true
	for _, p := range pods {
		if err := s.syncz(t, p); err != nil {
			return fmt.Errorf("after istiod came back: %w", err)
		}
	}
	return nil
}

// deletePod deletes a pod and returns how long until the API server has no
// such pod any more.
func (s *suite) deletePod(t *testing.T, pod string) (time.Duration, error) {
	start := time.Now()
	if _, err := s.n.kubectl("", "-n", testNS, "delete", "pod", pod, "--wait=false"); err != nil {
		return 0, err
	}
	if _, err := s.n.kubectl("", "-n", testNS, "wait", "--for=delete", "pod/"+pod, "--timeout=90s"); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
