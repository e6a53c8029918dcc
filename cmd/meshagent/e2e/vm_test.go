package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

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
// vmAgent is `meshagent vm` on Istio's VM bundle, in a network namespace
// of its own, its control plane across a veth, its CA on the namespace's
// loopback, systemd's notify socket beside it.
type vmAgent struct {
	ns, root  string
	envoyCopy string // the Envoy binary the mesh config names, under root
	cmd       *exec.Cmd
	p         *e2ekit.AgentProcess
	notify    <-chan string
}

// startVM starts a vmAgent with env added to the test's environment.
func startVM(t *testing.T, env ...string) *vmAgent {
	t.Helper()
	ns := needNetns(t)
	root := testkit.ShortTempDir(t, "meshagent-vm")
	// Envoy, as 1337, must reach its binary, bootstrap and sockets: the
	// root is a system directory, not a test's private one.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	envoyCopy := filepath.Join(root, "usr/local/bin/envoy")
	bin, err := os.ReadFile(e2ekit.EnvoyBinary)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, config.Rooted(root, "usr/local/bin/envoy"), bin)
	if err := os.Chmod(envoyCopy, 0o755); err != nil {
		t.Fatal(err)
	}

	// The VM bundle (istioctl x workload entry configure), Istio's paths.
	caRoot := pki.NewRoot(t, "vm test root")
	testkit.WriteFile(t, config.Rooted(root, clusterEnvFile), []byte(`# istioctl x workload entry configure
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
	e2ekit.StartControlPlaneIn(t, e2ekit.PeerNetns(t, ns, "10.99.0.1", "10.99.0.2"), "10.99.0.2:15010")
	e2ekit.StartCAIn(t, ns, "127.0.0.1:15012", caRoot)

	notify := e2ekit.NotifyListener(t, filepath.Join(root, "notify.sock"))
	cmd := exec.Command("ip", "netns", "exec", ns, e2ekit.AgentBinary, "vm", "--root", root, "--capture-check-interval", "100ms")
	cmd.Env = append(append(os.Environ(), "NOTIFY_SOCKET="+filepath.Join(root, "notify.sock"), "WATCHDOG_USEC=200000"), env...)
	p := &e2ekit.AgentProcess{Cmd: cmd, Stderr: &testkit.LogBuffer{}, Exited: make(chan error, 1), Root: root}
	p.Start(t)

	return &vmAgent{ns: ns, root: root, envoyCopy: envoyCopy, cmd: cmd, p: p, notify: notify}
}

func TestVMOnboardingUnderSystemd(t *testing.T) {
	vm := startVM(t)
	ns, root, envoyCopy, cmd, p, notify := vm.ns, vm.root, vm.envoyCopy, vm.cmd, vm.p, vm.notify
	e2ekit.AwaitNotify(t, notify, "READY=1", p, ns)
	e2ekit.AwaitNotify(t, notify, "WATCHDOG=1", p, ns)

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
	for _, pid := range e2ekit.ChildPIDs(t, cmd.Process.Pid) {
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe == envoyCopy {
			envoyPID = pid
		}
	}
	if envoyPID == 0 {
		t.Fatalf("no Envoy (%s) among the agent's children %v", envoyCopy, e2ekit.ChildPIDs(t, cmd.Process.Pid))
	}
	if uids, gids := e2ekit.ProcIDs(t, envoyPID); uids != "1337 1337" || gids != "1337 1337" {
		t.Fatalf("Envoy runs as uid %q gid %q, want 1337 for both", uids, gids)
	}
	if uids, gids := e2ekit.ProcIDs(t, cmd.Process.Pid); uids != "0 0" || gids != "1337 1337" {
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
	before := strings.Count(p.Stderr.String(), programmed)
	netnsRun(t, ns, "iptables", "-t", "nat", "-F")
	testkit.WaitFor(t, "the capture rules programmed again after a flush", func() bool {
		return strings.Count(p.Stderr.String(), programmed) > before
	})
	testkit.WaitFor(t, "the capture rules to be re-applied after a flush", func() bool { return checkRules() == "" })

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	e2ekit.AwaitNotify(t, notify, "STOPPING=1", p, ns)
	if code := p.WaitExit(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0", code)
	}
	if after := netnsRun(t, ns, "iptables-save"); strings.Contains(after, "ISTIO") {
		t.Fatalf("rules left after stop:\n%s", after)
	}

	// An agent that was SIGKILLed leaves its rules: the unit's ExecStopPost
	// (`vm clean`) removes them, unless ISTIO_CUSTOM_IP_TABLES=true says
	// they are not ours.
	netnsRun(t, ns, e2ekit.AgentBinary, "istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-b", "*")
	testkit.WriteFile(t, config.Rooted(root, sidecarEnvFile), []byte("ISTIO_CUSTOM_IP_TABLES='true'\n"))
	netnsRun(t, ns, e2ekit.AgentBinary, "vm", "clean", "--root", root)
	if after := netnsRun(t, ns, "iptables-save"); !strings.Contains(after, "ISTIO_OUTPUT") {
		t.Fatalf("vm clean removed rules despite ISTIO_CUSTOM_IP_TABLES=true:\n%s", after)
	}
	if err := os.Remove(config.Rooted(root, sidecarEnvFile)); err != nil {
		t.Fatal(err)
	}
	netnsRun(t, ns, e2ekit.AgentBinary, "vm", "clean", "--root", root)
	if after := netnsRun(t, ns, "iptables-save"); strings.Contains(after, "ISTIO") {
		t.Fatalf("rules left after vm clean:\n%s", after)
	}
}

// A VM's files where Istio's bundle puts them, under --root: the defaults
// of ISTIO_CLUSTER_CONFIG and ISTIO_SIDECAR_CONFIG (`meshagent help env`).
const (
	clusterEnvFile = "./var/lib/istio/envoy/cluster.env"
	sidecarEnvFile = "./var/lib/istio/envoy/sidecar.env"
)
