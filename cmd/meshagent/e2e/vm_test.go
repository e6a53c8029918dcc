package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// caHelperEnv makes the test binary an Istio CA (services/ca) serving
// "ADDR DIR" (DIR holds its root certificate and key) until it is
// signalled: the agent in a network namespace reaches it on that
// namespace's loopback, over TLS.
const caHelperEnv = "MESHAGENT_CA_HELPER"

func runCAHelper(spec string) int {
	addr, dir, _ := strings.Cut(spec, " ")
	cfg := ca.DefaultConfig(dir)
	cfg.Listen = addr
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	svc, err := ca.New(cfg, ca.Inputs{}, ca.Outputs{}, messages.NewRuntime(ca.Name, &testkit.HealthRecorder{}, nil, prometheus.NewRegistry(), log))
	if err != nil {
		fmt.Fprintln(os.Stderr, "CA helper:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := svc.Serve(ctx); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "CA helper:", err)
		return 1
	}
	return 0
}

// startCAIn runs the CA helper in the namespace at addr with root's
// certificate and key.
func startCAIn(t *testing.T, ns, addr string, root *pki.CA) {
	t.Helper()
	dir := t.TempDir()
	cfg := ca.DefaultConfig(dir)
	testkit.WriteFile(t, cfg.RootCertPath(), root.CertPEM)
	testkit.WriteFile(t, cfg.RootKeyPath(), pki.KeyPEM(t, root.Key))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, self)
	cmd.Env = append(os.Environ(), caHelperEnv+"="+addr+" "+dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
}

// notifyListener stands in for systemd: the NOTIFY_SOCKET datagram socket
// the agent's sd_notify lines arrive on, one per datagram.
func notifyListener(t *testing.T, path string) <-chan string {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	lines := make(chan string, 1024)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(lines)
				return
			}
			for _, l := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
				select {
				case lines <- l:
				default: // a test that stopped reading: watchdog pings only
				}
			}
		}
	}()
	return lines
}

// awaitNotify waits for want on lines, returning what came before it.
func awaitNotify(t *testing.T, lines <-chan string, want string, p *agentProcess, netns string) []string {
	t.Helper()
	var seen []string
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("notify socket closed before %s (seen %q)", want, seen)
			}
			if l == want {
				return seen
			}
			seen = append(seen, l)
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("agent exited (%v) before sending %s (seen %q)\n%s", err, want, seen, p.stderr.String())
		case <-deadline:
			// What the agent was waiting for: its tree, asked from
			// inside its network namespace (a flake once: no READY=1).
			tree, _ := exec.Command("ip", "netns", "exec", netns, agentBinary, "request", "--debug-port", "15020", "GET", "debug/tree").CombinedOutput()
			t.Fatalf("no %s from the agent within 30s (seen %d lines: %q...)\n/debug/tree:\n%s\nlog:\n%s", want, len(seen), seen[:min(len(seen), 5)], tree, p.stderr.String())
		}
	}
}

// procIDs are the real and effective uid and gid of a process.
func procIDs(t *testing.T, pid int) (uids, gids string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			uids = strings.Join(strings.Fields(v)[:2], " ")
		}
		if v, ok := strings.CutPrefix(l, "Gid:"); ok {
			gids = strings.Join(strings.Fields(v)[:2], " ")
		}
	}
	return uids, gids
}

// peerNetns makes a second network namespace joined to ns by a veth pair
// (created inside ns, never in the host's namespace): ns gets agentIP,
// the peer peerIP, both /24. Traffic from ns to the peer leaves through
// a real interface, where the capture rules apply.
func peerNetns(t *testing.T, ns, agentIP, peerIP string) string {
	t.Helper()
	peer := ns + "-peer"
	if out, err := exec.Command("ip", "netns", "add", peer).CombinedOutput(); err != nil {
		t.Skipf("cannot create a second network namespace: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", peer).Run() })
	for _, args := range [][]string{
		{"ip", "-n", ns, "link", "add", "vm0", "type", "veth", "peer", "name", "vm1", "netns", peer},
		{"ip", "-n", ns, "addr", "add", agentIP + "/24", "dev", "vm0"},
		{"ip", "-n", ns, "link", "set", "vm0", "up"},
		{"ip", "-n", peer, "addr", "add", peerIP + "/24", "dev", "vm1"},
		{"ip", "-n", peer, "link", "set", "vm1", "up"},
		{"ip", "-n", peer, "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	return peer
}

// Istio's VM onboarding under systemd: the bundle's files where Istio puts
// them (under --root), the real binary as the unit starts it, a notify
// socket standing in for systemd. The agent applies the capture as root,
// gets its certificate from the CA over TLS verified with the VM's root
// cert, runs Envoy as 1337:1337, reaches its control plane through the
// capture rules (ISTIO_SERVICE_CIDR='*': only the agent's proxy group
// keeps that connection from being redirected to Envoy, as running as
// istio-proxy does for Istio's agent), says READY=1 then WATCHDOG=1, puts the
// rules back when someone flushes the nat table, and on SIGTERM says
// STOPPING=1, exits 0 and leaves no rule behind.
func TestVMOnboardingUnderSystemd(t *testing.T) {
	ns := needNetns(t)
	root := testkit.ShortTempDir(t, "meshagent-vm")
	// Envoy, as 1337, must reach its binary, bootstrap and sockets: the
	// root is a system directory, not a test's private one.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	envoyCopy := filepath.Join(root, "usr/local/bin/envoy")
	bin, err := os.ReadFile(envoyBinary)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, config.Rooted(root, "usr/local/bin/envoy"), bin)
	if err := os.Chmod(envoyCopy, 0o755); err != nil {
		t.Fatal(err)
	}

	// The VM bundle (istioctl x workload entry configure), Istio's paths.
	caRoot := pki.NewRoot(t, "vm test root")
	testkit.WriteFile(t, config.Rooted(root, config.ClusterEnvFile), []byte(`# istioctl x workload entry configure
CANONICAL_REVISION='latest'
CANONICAL_SERVICE='vm-app'
ISTIO_INBOUND_PORTS='*'
ISTIO_LOCAL_EXCLUDE_PORTS='22,15090,15021,15020'
ISTIO_METAJSON_LABELS='{"app":"vm-app"}'
ISTIO_META_CLUSTER_ID='Kubernetes'
ISTIO_NAMESPACE='vm-ns'
ISTIO_SERVICE='vm-app.vm-ns'
ISTIO_SERVICE_CIDR='*'
SERVICE_ACCOUNT='vm-sa'
TRUST_DOMAIN='cluster.local'
PILOT_ADDRESS='10.99.0.2:15010'
ISTIO_CP_AUTH='NONE'
CA_ADDR='127.0.0.1:15012'
`))
	testkit.WriteFile(t, config.Rooted(root, config.MeshConfigFile), []byte(fmt.Sprintf("defaultConfig:\n  binaryPath: %s\n  terminationDrainDuration: 1s\n", envoyCopy)))
	testkit.WriteFile(t, config.Rooted(root, config.VMCertsDir+"/root-cert.pem"), caRoot.CertPEM)
	testkit.WriteFile(t, config.Rooted(root, config.TokenFile), []byte("vm-token"))
	// The control plane is across a veth: the agent's connection to it
	// leaves through the capture rules. (The CA serves on loopback only,
	// which the rules never capture.)
	startControlPlaneIn(t, peerNetns(t, ns, "10.99.0.1", "10.99.0.2"), "10.99.0.2:15010")
	startCAIn(t, ns, "127.0.0.1:15012", caRoot)

	notify := notifyListener(t, filepath.Join(root, "notify.sock"))
	cmd := exec.Command("ip", "netns", "exec", ns, agentBinary, "vm", "--root", root, "--capture-check-interval", "100ms")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+filepath.Join(root, "notify.sock"), "WATCHDOG_USEC=200000")
	p := &agentProcess{cmd: cmd, stderr: &testkit.LogBuffer{}, exited: make(chan error, 1), root: root}
	p.start(t)

	awaitNotify(t, notify, "READY=1", p, ns)
	awaitNotify(t, notify, "WATCHDOG=1", p, ns)

	wantRules := []string{"-A PREROUTING -p tcp -j ISTIO_INBOUND", "-A OUTPUT -j ISTIO_OUTPUT",
		"--dports 22,15090,15021,15020 -j RETURN", "-A ISTIO_OUTPUT -j ISTIO_REDIRECT",
		"-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN"}
	checkRules := func() string {
		rules := netnsRun(t, ns, "iptables-save", "-t", "nat")
		for _, want := range wantRules {
			if !strings.Contains(rules, want) {
				return want
			}
		}
		return ""
	}
	if missing := checkRules(); missing != "" {
		t.Fatalf("capture rules lack %q:\n%s", missing, netnsRun(t, ns, "iptables-save", "-t", "nat"))
	}

	// Envoy runs as the proxy user; the agent stays root in the proxy's
	// group, which the rules' --gid-owner exception lets through.
	var envoyPID int
	for _, pid := range childPIDs(t, cmd.Process.Pid) {
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe == envoyCopy {
			envoyPID = pid
		}
	}
	if envoyPID == 0 {
		t.Fatalf("no Envoy (%s) among the agent's children %v", envoyCopy, childPIDs(t, cmd.Process.Pid))
	}
	if uids, gids := procIDs(t, envoyPID); uids != "1337 1337" || gids != "1337 1337" {
		t.Fatalf("Envoy runs as uid %q gid %q, want 1337 for both", uids, gids)
	}
	if uids, gids := procIDs(t, cmd.Process.Pid); uids != "0 0" || gids != "1337 1337" {
		t.Fatalf("agent runs as uid %q gid %q, want uid 0, gid 1337", uids, gids)
	}
	// The certificate came from the CA, over TLS verified with the VM's
	// root: written where istio-start.sh's OUTPUT_CERTS points.
	if _, err := os.Stat(config.Rooted(root, config.VMCertsDir+"/cert-chain.pem")); err != nil {
		t.Fatalf("no certificate from the CA in OUTPUT_CERTS: %v", err)
	}

	// Chaos: someone flushes the nat table; the rules come back. That the
	// agent programmed them again proves the flush took effect: the rules
	// themselves may be back (a check every 100ms) before a test can see
	// them gone.
	const programmed = `msg="capture rules programmed"`
	before := strings.Count(p.stderr.String(), programmed)
	netnsRun(t, ns, "iptables", "-t", "nat", "-F")
	testkit.WaitFor(t, "the capture rules programmed again after a flush", func() bool {
		return strings.Count(p.stderr.String(), programmed) > before
	})
	testkit.WaitFor(t, "the capture rules to be re-applied after a flush", func() bool { return checkRules() == "" })

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	awaitNotify(t, notify, "STOPPING=1", p, ns)
	if code := p.waitExit(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0", code)
	}
	if after := netnsRun(t, ns, "iptables-save"); strings.Contains(after, "ISTIO") {
		t.Fatalf("rules left after stop:\n%s", after)
	}

	// An agent that was SIGKILLed leaves its rules: the unit's ExecStopPost
	// (`vm clean`) removes them, unless ISTIO_CUSTOM_IP_TABLES=true says
	// they are not ours.
	netnsRun(t, ns, agentBinary, "istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-b", "*")
	testkit.WriteFile(t, config.Rooted(root, config.SidecarEnvFile), []byte("ISTIO_CUSTOM_IP_TABLES='true'\n"))
	netnsRun(t, ns, agentBinary, "vm", "clean", "--root", root)
	if after := netnsRun(t, ns, "iptables-save"); !strings.Contains(after, "ISTIO_OUTPUT") {
		t.Fatalf("vm clean removed rules despite ISTIO_CUSTOM_IP_TABLES=true:\n%s", after)
	}
	if err := os.Remove(config.Rooted(root, config.SidecarEnvFile)); err != nil {
		t.Fatal(err)
	}
	netnsRun(t, ns, agentBinary, "vm", "clean", "--root", root)
	if after := netnsRun(t, ns, "iptables-save"); strings.Contains(after, "ISTIO") {
		t.Fatalf("rules left after vm clean:\n%s", after)
	}
}
