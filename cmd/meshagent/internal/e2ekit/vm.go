package e2ekit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
	"github.com/prometheus/client_golang/prometheus"
)

// CAHelperEnv makes the test binary an Istio CA (services/ca) serving
// "ADDR DIR TRUST_DOMAIN" (DIR holds its root certificate and key) until it is
// signalled: the agent in a network namespace reaches it on that
// namespace's loopback, over TLS.
const CAHelperEnv = "MESHAGENT_CA_HELPER"

func RunCAHelper(spec string) int {
	addr, rest, _ := strings.Cut(spec, " ")
	dir, trustDomain, _ := strings.Cut(rest, " ")
	cfg := ca.NewConfig(addr, dir, time.Hour, trustDomain)
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

// StartCAIn runs the CA helper in the namespace at addr with root's
// certificate and key.
func StartCAIn(t *testing.T, ns, addr string, root *pki.CA) {
	t.Helper()
	dir := t.TempDir()
	cfg := ca.NewConfig(addr, dir, time.Hour, testkit.TableDefault[string](t, "TRUST_DOMAIN"))
	testkit.WriteFile(t, cfg.RootCertPath(), root.CertPEM)
	testkit.WriteFile(t, cfg.RootKeyPath(), pki.KeyPEM(t, root.Key))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, self)
	cmd.Env = append(os.Environ(), CAHelperEnv+"="+addr+" "+dir+" "+cfg.TrustDomain)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
}

// NotifyListener stands in for systemd: the NOTIFY_SOCKET datagram socket
// the agent's sd_notify lines arrive on, one per datagram.
func NotifyListener(t *testing.T, path string) <-chan string {
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

// AwaitNotify waits for want on lines, returning what came before it.
func AwaitNotify(t *testing.T, lines <-chan string, want string, p *AgentProcess, netns string) []string {
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
		case err := <-p.Exited:
			p.Exited <- err
			t.Fatalf("agent exited (%v) before sending %s (seen %q)\n%s", err, want, seen, p.Stderr.String())
		case <-deadline:
			// What the agent was waiting for: its tree, asked from
			// inside its network namespace (a flake once: no READY=1).
			tree, _ := exec.Command("ip", "netns", "exec", netns, AgentBinary, "request", "--debug-port", "15020", "GET", "debug/tree").CombinedOutput()
			t.Fatalf("no %s from the agent within 30s (seen %d lines: %q...)\n/debug/tree:\n%s\nlog:\n%s", want, len(seen), seen[:min(len(seen), 5)], tree, p.Stderr.String())
		}
	}
}

// ProcIDs are the real and effective uid and gid of a process.
func ProcIDs(t *testing.T, pid int) (uids, gids string) {
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

// PeerNetns makes a second network namespace joined to ns by a veth pair
// (created inside ns, never in the host's namespace): ns gets agentIP,
// the peer peerIP, both /24. Traffic from ns to the peer leaves through
// a real interface, where the capture rules apply.
func PeerNetns(t *testing.T, ns, agentIP, peerIP string) string {
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
