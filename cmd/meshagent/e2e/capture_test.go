package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// needNetns makes a named network namespace with loopback up, or skips.
func needNetns(t *testing.T) string {
	t.Helper()
	testkit.RequireRoot(t, "to create a network namespace", "ip", "iptables-save")
	name := fmt.Sprintf("meshagent-e2e-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v %s", err, out)
	}
	return name
}

func netnsRun(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	return string(out)
}

// In VM mode (--capture) the agent owns the capture: it applies Istio's
// rules from the ISTIO_* environment at start and removes exactly them
// when it stops.
func TestVMModeAppliesAndRemovesCapture(t *testing.T) {
	ns := needNetns(t)
	before := netnsRun(t, ns, "iptables-save")
	p := e2ekit.StartAgentIn(t, ns, []string{
		"ISTIO_INBOUND_PORTS=*", "ISTIO_SERVICE_CIDR=*", "ISTIO_LOCAL_EXCLUDE_PORTS=22,15090,15021,15020",
	}, "--capture")
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _ := exec.Command("ip", "netns", "exec", ns, e2ekit.AgentBinary, "wait", "--url", p.Base+"/healthz/ready",
			"--timeoutSeconds", "1", "--periodMillis", "50").CombinedOutput()
		if strings.Contains(string(out), "Envoy is ready!") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent in netns never ready: %s\n%s", out, p.Stderr.String())
		}
	}
	rules := netnsRun(t, ns, "iptables-save", "-t", "nat")
	for _, want := range []string{"-A PREROUTING -p tcp -j ISTIO_INBOUND", "-A OUTPUT -j ISTIO_OUTPUT",
		"--dports 22,15090,15021,15020 -j RETURN", "-A ISTIO_OUTPUT -j ISTIO_REDIRECT"} {
		if !strings.Contains(rules, want) {
			t.Fatalf("capture rules lack %q:\n%s", want, rules)
		}
	}
	p.StopWith(t, syscall.SIGTERM)
	after := netnsRun(t, ns, "iptables-save")
	if strings.Contains(after, "ISTIO") {
		t.Fatalf("rules left after stop:\n%s\n(before:\n%s)", after, before)
	}
}
