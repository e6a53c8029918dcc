package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// Istio's listeners, as istiod sends them: only the two capture listeners
// relay, on every address they bind (#20).
func TestCaptureListenersAreIstiosVirtualListeners(t *testing.T) {
	addr := func(host string, port uint32) *corev3.Address {
		return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
	}
	ls := []*listenerv3.Listener{
		{Name: "virtualOutbound", Address: addr("0.0.0.0", 15001), UseOriginalDst: wrapperspb.Bool(true),
			TrafficDirection:    corev3.TrafficDirection_OUTBOUND,
			AdditionalAddresses: []*listenerv3.AdditionalAddress{{Address: addr("::", 15001)}}},
		{Name: "virtualInbound", Address: addr("0.0.0.0", 15006), TrafficDirection: corev3.TrafficDirection_INBOUND,
			ListenerFilters: []*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.original_dst"}}},
		// Handed connections by virtualOutbound; they bind nothing.
		{Name: "0.0.0.0_8080", Address: addr("0.0.0.0", 8080), BindToPort: wrapperspb.Bool(false)},
		{Name: "10.96.0.10_9000", Address: addr("10.96.0.10", 9000), BindToPort: wrapperspb.Bool(false), UseOriginalDst: wrapperspb.Bool(false)},
		// The readiness listener: HTTP, served by listeners.go.
		{Name: "0.0.0.0_15021", Address: addr("0.0.0.0", 15021)},
	}
	got := captureListeners(ls)
	want := []relaySpec{
		{name: "virtualOutbound", stat: "0.0.0.0_15001", addr: "0.0.0.0:15001"},
		{name: "virtualOutbound", stat: "0.0.0.0_15001", addr: "[::]:15001"},
		{name: "virtualInbound", stat: "0.0.0.0_15006", addr: "0.0.0.0:15006", inbound: true},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("captureListeners = %+v, want %+v", got, want)
	}
}

// In a pod's network namespace with the sidecar capture rules applied by
// meshagent istio-iptables, the stand-in running as istio-proxy (1337)
// carries the application's traffic both ways (#20): outbound TCP to a peer
// reaches it through 15001 (the peer sees a new connection, the stand-in's),
// inbound TCP to the pod's address reaches the application through 15006
// from 127.0.0.6, and the stand-in's listener counters count each.
func TestRelaysCapturedTrafficToTheOriginalDestination(t *testing.T) {
	testkit.RequireRoot(t, "network namespaces, iptables, a process as uid 1337", "ip", "nsenter", "iptables-restore")
	bins := buildBinaries(t)
	pod, peer := netnsPair(t)

	if out, err := exec.Command("ip", "netns", "exec", pod, bins.meshagent, "istio-iptables", "-p", "15001", "-z", "15006",
		"-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020").CombinedOutput(); err != nil {
		t.Fatalf("meshagent istio-iptables: %v\n%s", err, out)
	}

	boot := filepath.Join(bins.dir, "bootstrap.json")
	if err := os.WriteFile(boot, []byte(captureBootstrap), 0o644); err != nil {
		t.Fatal(err)
	}
	log := testkit.NewLogBuffer(t)
	// --disable-hot-restart, as the agent runs it: the hot restart shared
	// memory (/dev/shm, shared with the host) is no business of this test.
	envoy := exec.Command("nsenter", "--net=/run/netns/"+pod, "-S", "1337", "-G", "1337", bins.fakeenvoy, "-c", boot, "--disable-hot-restart")
	envoy.Stdout, envoy.Stderr = log, log
	if err := envoy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { envoy.Process.Kill(); envoy.Wait() })
	log.WaitLine(t, "relay virtualInbound on 0.0.0.0:15006")
	log.WaitLine(t, "relay virtualOutbound on 0.0.0.0:15001")

	// The peer's server and the application, each answering with what it
	// received and whom from.
	testkit.InNetns(t, peer, func() error { return echo("tcp", "10.77.0.2:8080", "peer") })
	testkit.InNetns(t, pod, func() error { return echo("tcp", "0.0.0.0:9080", "app") })

	// Outbound: the application (root, not 1337) calls the peer.
	var local, answer string
	testkit.InNetns(t, pod, func() (err error) { local, answer, err = call("10.77.0.2:8080", "out"); return err })
	if !strings.HasPrefix(answer, "peer got out from 10.77.0.1:") || strings.HasSuffix(answer, " from "+local) {
		t.Errorf("outbound: the peer answered %q to a call from %s; want the stand-in's own connection from 10.77.0.1", answer, local)
	}
	// Inbound: the peer calls the application on the pod's address.
	testkit.InNetns(t, peer, func() (err error) { local, answer, err = call("10.77.0.1:9080", "in"); return err })
	if !strings.HasPrefix(answer, "app got in from 127.0.0.6:") {
		t.Errorf("inbound: the application answered %q; want the call relayed from 127.0.0.6", answer)
	}

	var stats string
	testkit.InNetns(t, pod, func() (err error) { stats, err = httpGet("127.0.0.1:15000", "/stats"); return err })
	testkit.Contains(t, "the stand-in's /stats", stats,
		"listener.0.0.0.0_15001.downstream_cx_total: 1\n", "listener.0.0.0.0_15006.downstream_cx_total: 1\n")
	log.WaitLine(t, "relay virtualOutbound:", "-> 10.77.0.2:8080 (original destination", "4 bytes sent")
	log.WaitLine(t, "relay virtualInbound:", "-> 10.77.0.1:9080 (original destination, from 127.0.0.6:", "3 bytes sent")
}

// captureBootstrap has Istio's two capture listeners static, so that the
// stand-in needs no control plane here; from istiod they come over LDS
// and are opened the same way.
const captureBootstrap = `{
  "node": {"id": "sidecar~10.77.0.1~app.default~default.svc.cluster.local", "cluster": "app.default"},
  "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 15000}}},
  "static_resources": {"listeners": [
    {"name": "virtualOutbound", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
     "use_original_dst": true, "traffic_direction": "OUTBOUND"},
    {"name": "virtualInbound", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
     "traffic_direction": "INBOUND",
     "listener_filters": [{"name": "envoy.filters.listener.original_dst",
       "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}}]}
  ]}
}`

type binaries struct{ dir, meshagent, fakeenvoy string }

// buildBinaries builds meshagent and the stand-in where istio-proxy can run
// them.
func buildBinaries(t *testing.T) binaries {
	t.Helper()
	dir := testkit.ShortTempDir(t, "fakeenvoy-relay")
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b := binaries{dir: dir, meshagent: filepath.Join(dir, "meshagent"), fakeenvoy: filepath.Join(dir, "fakeenvoy")}
	for bin, pkg := range map[string]string{b.meshagent: "../../cmd/meshagent", b.fakeenvoy: "."} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return b
}

// netnsPair is a pod namespace (10.77.0.1) and a peer namespace (10.77.0.2)
// joined by a veth pair, loopback up in both; removed at the end.
func netnsPair(t *testing.T) (pod, peer string) {
	t.Helper()
	pod, peer = fmt.Sprintf("fe-pod-%d", os.Getpid()), fmt.Sprintf("fe-peer-%d", os.Getpid())
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []string{pod, peer} {
		sh("ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		sh("ip", "-n", ns, "link", "set", "lo", "up")
	}
	sh("ip", "-n", pod, "link", "add", "fe0", "type", "veth", "peer", "name", "fe1", "netns", peer)
	sh("ip", "-n", pod, "addr", "add", "10.77.0.1/24", "dev", "fe0")
	sh("ip", "-n", peer, "addr", "add", "10.77.0.2/24", "dev", "fe1")
	sh("ip", "-n", pod, "link", "set", "fe0", "up")
	sh("ip", "-n", peer, "link", "set", "fe1", "up")
	return pod, peer
}

// echo listens on addr and answers each connection's first line with
// "<who> got <line> from <remote address>".
func echo(network, addr, who string) error {
	ln, err := net.Listen(network, addr)
	if err != nil {
		return err
	}
	testkit.ServeConns(ln, func(c net.Conn) {
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Fprintf(c, "%s got %s from %s\n", who, strings.TrimSpace(line), c.RemoteAddr())
	})
	return nil
}

// call sends one line to addr and returns its local address and the answer.
func call(addr, line string) (local, answer string, err error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\n", line); err != nil {
		return "", "", err
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	return c.LocalAddr().String(), strings.TrimSpace(reply), err
}

// httpGet is a GET over a connection dialled here (http.Client dials on
// another goroutine, hence another thread, outside the namespace).
func httpGet(addr, path string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr)
	b, err := io.ReadAll(c)
	return string(b), err
}
