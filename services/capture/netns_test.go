package capture

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// Real-kernel tests. Each runs its body in a fresh network namespace: the
// test binary re-executes itself under "unshare -n" for that one test. The
// namespace gets a veth pair to a peer namespace (ip netns add, removed at
// the end) with TEST-NET addresses; the peer owns 198.51.100.7 and
// 2001:db8:1::7 (the "remote service") and runs a listener there.
//
// Helper processes are the same binary in a helper mode (CAPTURE_TEST_HELPER).

const (
	envNetns  = "CAPTURE_TEST_NETNS"
	envHelper = "CAPTURE_TEST_HELPER"
	envArgs   = "CAPTURE_TEST_ARGS"
)

// runHelper runs a helper mode instead of the tests; returns false if none.
func runHelper() bool {
	switch os.Getenv(envHelper) {
	case "dial":
		os.Exit(helperDial(os.Getenv(envArgs)))
	case "listen":
		helperListen(strings.Split(os.Getenv(envArgs), ","))
		os.Exit(0)
	case "dns":
		helperDNS()
		os.Exit(0)
	case "sidecar":
		health := messages.NewCell[messages.Health]()
		svc, err := New(Config{Mode: Sidecar, Rules: sidecarConfig(testkit.ExitOnFatal{}, false, "")}, Inputs{}, Outputs{}, messages.NewRuntime(Name, health, nil, nil, nil))
		if err == nil {
			err = svc.Serve(context.Background())
		}
		h, _ := health.Get()
		fmt.Printf("%v|%s|%s\n", err, h.State, h.Reason)
		os.Exit(0)
	case "validate":
		cfg := sidecarConfig(testkit.ExitOnFatal{}, false, "")
		cfg.HostIP = netip.MustParseAddr("192.0.2.1")
		cfg.ProbeTimeout, _ = time.ParseDuration(os.Getenv(envArgs))
		if err := ValidateCapture(context.Background(), cfg); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("validated")
		os.Exit(0)
	}
	return false
}

// helperDial dials "tcp ADDR" or "udp ADDR", prints the first line the
// server sends (or "error: ...").
func helperDial(args string) int {
	network, addr, _ := strings.Cut(args, " ")
	line, err := dial(network, addr)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Print(line)
	return 0
}

func dial(network, addr string) (string, error) {
	c, err := net.DialTimeout(network, addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if network == "udp" {
		c.Write([]byte("query\n"))
	}
	return bufio.NewReader(c).ReadString('\n')
}

// helperListen serves "peer <local addr>" on each TCP address until stdin
// closes.
func helperListen(addrs []string) {
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "peer %s\n", c.LocalAddr())
				c.Close()
			}
		}()
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
}

// helperDNS answers "dns" to every UDP datagram on port 15053 (both
// families) until stdin closes. It runs as the proxy UID, like the agent's
// DNS proxy: the conntrack-zone rules match the proxy's replies by owner.
func helperDNS() {
	// Bound to loopback, like Istio's DNS proxy: replies must leave from the
	// address the query was redirected to, or conntrack cannot un-NAT them.
	for _, addr := range []string{"127.0.0.1:15053", "[::1]:15053"} {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		go func() {
			buf := make([]byte, 512)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo([]byte("dns\n"), from)
			}
		}()
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
}

// startHelper starts a long-running helper (optionally as uid, optionally
// in the peer namespace) and waits for its "ready".
func (tp *topology) startHelper(t *testing.T, mode, args string, uid uint32, inPeer bool) {
	t.Helper()
	var cmd *exec.Cmd
	if inPeer {
		cmd = exec.Command("ip", "netns", "exec", tp.peer, tp.bin)
	} else {
		cmd = exec.Command(tp.bin)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	}
	cmd.Env = append(os.Environ(), envHelper+"="+mode, envArgs+"="+args)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		t.Fatalf("helper %s: %q", mode, line)
	}
}

// inNetns returns true when the caller is already inside its namespace (run
// the body); otherwise it runs this test in a new one, reports the outcome
// and returns false.
func inNetns(t *testing.T, unshareFlags ...string) bool {
	t.Helper()
	if os.Getenv(envNetns) == t.Name() {
		return true
	}
	requireKernel(t)
	t.Parallel() // each runs in its own namespaces
	cmd := exec.Command("unshare", append(append([]string{"-n"}, unshareFlags...), os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1", "-test.timeout=60s")...)
	cmd.Env = append(os.Environ(), envNetns+"="+t.Name())
	out, err := cmd.CombinedOutput()
	t.Logf("in a new network namespace:\n%s", out)
	if err != nil {
		t.Fatalf("test in network namespace failed: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("test did not pass in the network namespace")
	}
	return false
}

func requireKernel(t *testing.T) {
	t.Helper()
	testkit.RequireRoot(t, "network namespaces, iptables", "unshare", "ip", "iptables", "iptables-save", "iptables-restore", "ip6tables")
}

func sh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// topology is the namespace the test runs in, wired to a peer namespace.
type topology struct {
	peer string // peer namespace name
	bin  string // a copy of the test binary other UIDs can execute
}

func setupTopology(t *testing.T) *topology {
	t.Helper()
	tp := &topology{peer: fmt.Sprintf("capture-peer-%d", os.Getpid())}
	sh(t, "ip", "link", "set", "lo", "up")
	sh(t, "ip", "netns", "add", tp.peer)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", tp.peer).Run() })
	sh(t, "ip", "link", "add", "cap0", "type", "veth", "peer", "name", "cap1", "netns", tp.peer)
	sh(t, "ip", "addr", "add", "192.0.2.1/24", "dev", "cap0")
	sh(t, "ip", "-6", "addr", "add", "2001:db8::1/64", "dev", "cap0", "nodad")
	sh(t, "ip", "link", "set", "cap0", "up")
	sh(t, "ip", "route", "add", "198.51.100.0/24", "via", "192.0.2.2")
	sh(t, "ip", "-6", "route", "add", "2001:db8:1::/48", "via", "2001:db8::2")
	in := func(args ...string) { sh(t, append([]string{"ip", "netns", "exec", tp.peer}, args...)...) }
	in("ip", "link", "set", "lo", "up")
	in("ip", "addr", "add", "192.0.2.2/24", "dev", "cap1")
	in("ip", "-6", "addr", "add", "2001:db8::2/64", "dev", "cap1", "nodad")
	in("ip", "link", "set", "cap1", "up")
	in("ip", "addr", "add", "198.51.100.7/32", "dev", "lo")
	in("ip", "-6", "addr", "add", "2001:db8:1::7/128", "dev", "lo")
	// A second service address, for the excluded-CIDR cases.
	in("ip", "addr", "add", "198.51.100.8/32", "dev", "lo")
	in("ip", "-6", "addr", "add", "2001:db8:1::8/128", "dev", "lo")

	// Test binaries live in 0700 build dirs: copy for other UIDs.
	dir := testkit.ShortTempDir(t, "capture-bin-")
	os.Chmod(dir, 0o755)
	tp.bin = filepath.Join(dir, "capture.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tp.bin, data, 0o755); err != nil {
		t.Fatal(err)
	}

	// The remote service in the peer namespace.
	tp.startHelper(t, "listen", ":8080,:8081", 0, true)
	return tp
}

// dialAs connects from this namespace as uid (0 = this process, in-process
// would also do, but a child keeps all cases alike) and returns the reply.
func (tp *topology) dialAs(t *testing.T, uid uint32, network, addr string) string {
	t.Helper()
	if uid == 0 { // this process: no child needed
		reply, err := dial(network, addr)
		if err != nil {
			return "error: " + err.Error()
		}
		return strings.TrimSpace(reply)
	}
	cmd := exec.Command(tp.bin)
	cmd.Env = append(os.Environ(), envHelper+"=dial", envArgs+"="+network+" "+addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, _ := cmd.CombinedOutput()
	return strings.TrimSpace(string(out))
}

// dialFromPeer connects from the peer namespace (inbound traffic).
func (tp *topology) dialFromPeer(t *testing.T, addr string) string {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", tp.peer, tp.bin)
	cmd.Env = append(os.Environ(), envHelper+"=dial", envArgs+"=tcp "+addr)
	out, _ := cmd.CombinedOutput()
	return strings.TrimSpace(string(out))
}

// proxyListeners stands in for Envoy and the DNS proxy: 15001 and 15006
// answer "<port> <original destination>", 15021 answers "direct 15021",
// 15053 (TCP) answers "dns"; UDP 15053 is helperDNS.
func proxyListeners(t *testing.T, transparentInbound bool) {
	t.Helper()
	serve := func(ln net.Listener, reply func(c net.Conn) string) {
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(c, reply(c))
				c.Close()
			}
		}()
	}
	origDst := func(port string) func(net.Conn) string {
		return func(c net.Conn) string {
			d, err := OriginalDst(c)
			if err != nil {
				return port + " error " + err.Error()
			}
			return port + " " + d.String()
		}
	}
	for _, network := range []string{"tcp4", "tcp6"} {
		for _, port := range []string{"15001", "15006", "15021", "15053"} {
			lc := net.ListenConfig{}
			if port == "15006" && transparentInbound {
				lc.Control = func(_, _ string, rc syscall.RawConn) error {
					var serr error
					rc.Control(func(fd uintptr) {
						if network == "tcp4" {
							serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
						} else {
							serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
						}
					})
					return serr
				}
			}
			ln, err := lc.Listen(context.Background(), network, ":"+port)
			if err != nil {
				t.Fatalf("listen %s %s: %v", network, port, err)
			}
			switch {
			case port == "15021":
				serve(ln, func(net.Conn) string { return "direct 15021" })
			case port == "15053":
				serve(ln, func(net.Conn) string { return "dns" })
			case port == "15006" && transparentInbound:
				serve(ln, func(c net.Conn) string { return "15006 " + c.LocalAddr().String() })
			default:
				serve(ln, origDst(port))
			}
		}
	}
}

func saveState(t *testing.T, v6 bool) SaveState {
	t.Helper()
	bin := "iptables-save"
	if v6 {
		bin = "ip6tables-save"
	}
	return ParseSave(sh(t, bin))
}

// sidecarConfig is the injector's init-container config plus DNS capture
// and one excluded outbound port.
func sidecarConfig(t testkit.Failer, v6 bool, mode string) RulesConfig {
	cfg := testRules(t)
	cfg.InboundInterceptionMode = mode
	cfg.OutboundIPRangesInclude = "*"
	cfg.InboundPortsInclude = "*"
	cfg.InboundPortsExclude = "15090,15021,15020"
	cfg.OutboundPortsExclude = "8081"
	cfg.RedirectDNS = true
	cfg.DNSServersV4 = []string{"198.51.100.53"}
	cfg.DNSServersV6 = []string{"2001:db8:1::53"}
	cfg.EnableIPv6 = v6
	return cfg
}

func expect(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s: got %q, want %q", what, got, want)
	}
}

// trafficBackend is one capture backend as the traffic test drives it:
// execute builds the rules for cfg and runs the backend's istio-iptables
// step; state is what the kernel holds of ours, ordered, without counters.
type trafficBackend struct {
	name    string
	execute func(t *testing.T, cfg RulesConfig) (Outcome, error)
	state   func(t *testing.T) string
}

func iptablesBackend(t *testing.T) trafficBackend {
	a, err := NewApplier("", true, testkit.TestLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("backend %s", a.Backend())
	return trafficBackend{
		name: "iptables",
		execute: func(t *testing.T, cfg RulesConfig) (Outcome, error) {
			return Execute(cfg, Build(cfg), a, testkit.TestLogger(t))
		},
		state: func(t *testing.T) string {
			return fmt.Sprint(saveState(t, false).Normalized()) + "\n" + fmt.Sprint(saveState(t, true).Normalized())
		},
	}
}

func nftBackend(t *testing.T) trafficBackend {
	requireNft(t)
	a, err := NewNftApplier(testkit.TestLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return trafficBackend{
		name: "nftables",
		execute: func(t *testing.T, cfg RulesConfig) (Outcome, error) {
			return ExecuteNft(context.Background(), cfg, BuildNft(cfg), a, testkit.TestLogger(t))
		},
		state: func(t *testing.T) string {
			st, err := a.State(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
	}
}

// captureTraffic applies cfg in this namespace with one backend, sends real
// connections, then cleans up and checks the namespace's rules are as
// before. The same connections, the same answers, whichever backend (#23).
func captureTraffic(t *testing.T, newBackend func(*testing.T) trafficBackend, v6 bool, mode string) {
	tp := setupTopology(t)
	proxyListeners(t, mode == "TPROXY")
	tp.startHelper(t, "dns", "", 1337, false)
	b := newBackend(t)
	before := b.state(t)

	cfg := sidecarConfig(t, v6, mode)
	cfg.OutboundIPRangesExclude = "198.51.100.8/32,2001:db8:1::8/128"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if out, err := b.execute(t, cfg); err != nil || out != Applied {
		t.Fatalf("%s: execute = %v, %v; want applied", b.name, out, err)
	}
	applied := b.state(t)
	if applied == before {
		t.Fatalf("%s: no rules of ours after apply", b.name)
	}

	remote, excluded, local, dns := "198.51.100.7", "198.51.100.8", "192.0.2.1", "198.51.100.53"
	if v6 {
		remote, excluded, local, dns = "[2001:db8:1::7]", "[2001:db8:1::8]", "[2001:db8::1]", "[2001:db8:1::53]"
	}
	expect(t, "outbound from uid 0", tp.dialAs(t, 0, "tcp", remote+":8080"), "15001 "+remote+":8080")
	expect(t, "outbound from uid 1000", tp.dialAs(t, 1000, "tcp", remote+":8080"), "15001 "+remote+":8080")
	expect(t, "outbound from proxy uid 1337 (not captured)", tp.dialAs(t, 1337, "tcp", remote+":8080"), "peer "+remote+":8080")
	expect(t, "outbound to excluded port 8081", tp.dialAs(t, 0, "tcp", remote+":8081"), "peer "+remote+":8081")
	expect(t, "outbound to an excluded CIDR", tp.dialAs(t, 0, "tcp", excluded+":8080"), "peer "+excluded+":8080")
	expect(t, "inbound ("+mode+")", tp.dialFromPeer(t, local+":9080"), "15006 "+local+":9080")
	expect(t, "inbound to excluded port 15021", tp.dialFromPeer(t, local+":15021"), "direct 15021")
	expect(t, "DNS over UDP", tp.dialAs(t, 0, "udp", dns+":53"), "dns")
	expect(t, "DNS over TCP", tp.dialAs(t, 0, "tcp", dns+":53"), "dns")

	// Idempotent: a second run changes nothing and adds no duplicates.
	if out, err := b.execute(t, cfg); err != nil || out != Unchanged {
		t.Fatalf("%s: second execute = %v, %v; want unchanged", b.name, out, err)
	}
	if again := b.state(t); again != applied {
		t.Errorf("second run changed the rules:\n%s", testkit.LineDiff(applied, again))
	}

	// --cleanup-only restores the namespace's rules.
	cfg.CleanupOnly = true
	if _, err := b.execute(t, cfg); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if after := b.state(t); after != before {
		t.Errorf("rules after cleanup differ from before:\n%s", testkit.LineDiff(before, after))
	}
	expect(t, "outbound after cleanup", tp.dialAs(t, 0, "tcp", remote+":8080"), "peer "+remote+":8080")
}

// Both backends, both capture modes, each for IPv4 and IPv6, in a network
// namespace of their own.
func TestKernelCapture(t *testing.T) {
	for _, backend := range []struct {
		name string
		new  func(*testing.T) trafficBackend
	}{{"iptables", iptablesBackend}, {"nft", nftBackend}} {
		for _, mode := range []string{"REDIRECT", "TPROXY"} {
			for _, ipv6 := range []bool{false, true} {
				name := backend.name + "_" + mode + "_IPv4"
				if ipv6 {
					name = backend.name + "_" + mode + "_IPv6"
				}
				t.Run(name, func(t *testing.T) {
					if inNetns(t) {
						captureTraffic(t, backend.new, ipv6, mode)
					}
				})
			}
		}
	}
}
