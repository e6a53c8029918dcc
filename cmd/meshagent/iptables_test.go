package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// runIptables runs "meshagent <args>" with injected env and host inputs and
// returns the exit code, stdout and stderr.
func runIptables(t *testing.T, env map[string]string, hostFamily string, nameservers []string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := execute(&cliContext{args: args, host: iptablesHost(t, env, hostFamily, nameservers), stdout: &stdout, stderr: &stderr})
	return code, stdout.String(), stderr.String()
}

// iptablesHost is a host with env, one address of hostFamily and a
// resolv.conf listing nameservers.
func iptablesHost(t *testing.T, env map[string]string, hostFamily string, nameservers []string) config.Host {
	t.Helper()
	addr := netip.MustParsePrefix("192.0.2.10/24")
	if hostFamily == "ipv6" {
		addr = netip.MustParsePrefix("2001:db8::10/64")
	}
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	var sb strings.Builder
	for _, ns := range nameservers {
		sb.WriteString("nameserver " + ns + "\n")
	}
	if err := os.WriteFile(resolv, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return config.Host{
		Env:            config.MapEnvironment(env),
		LookupUID:      func(string) (string, error) { return "", errors.New("no such user") },
		ResolvConf:     resolv,
		InterfaceAddrs: func() ([]netip.Prefix, error) { return []netip.Prefix{addr}, nil },
	}
}

var sidecarArgs = []string{"istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT",
	"-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020", "--dry-run"}

func TestIstioIptablesDryRun(t *testing.T) {
	code, out, errOut := runIptables(t, nil, "ipv6", nil, sidecarArgs...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	testkit.Contains(t, "dry-run output", out,
		"# IPv4: iptables-restore --noflush",
		"# IPv6: ip6tables-restore --noflush",
		"-A ISTIO_INBOUND -p tcp -m multiport --dports 15090,15021,15020 -j RETURN",
		"-A ISTIO_OUTPUT -o lo -s ::6/128 -j RETURN",
		"-A ISTIO_OUTPUT -j ISTIO_REDIRECT",
	)
}

// TestIstioIptablesConformanceCLI: for each of Istio's 30 capture cases,
// the CLI's dry-run restore inputs, from the case's flags, environment and
// host (address family, resolv.conf), equal Istio's golden, all but
// dns-uid-gid exactly: Istio's test config held the literal "::127.0.0.53",
// which istio-iptables itself (and we) read from resolv.conf as ::7f00:35.
func TestIstioIptablesConformanceCLI(t *testing.T) {
	dir := filepath.Join("..", "..", "services", "capture", "testdata", "conformance")
	data, err := os.ReadFile(filepath.Join(dir, "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Name   string            `json:"name"`
		Flags  []string          `json:"flags"`
		Env    map[string]string `json:"env"`
		Inputs struct {
			HostFamily  string   `json:"host_primary_ip_family"`
			Nameservers []string `json:"resolv_conf_nameservers"`
		} `json:"inputs"`
		GoldenFile string `json:"golden_file"`
	}
	if err := json.Unmarshal(data, &cases); err != nil || len(cases) != 30 {
		t.Fatalf("cases.json: %d cases, %v", len(cases), err)
	}
	exact := 0
	for _, c := range cases {
		golden, err := os.ReadFile(filepath.Join(dir, c.GoldenFile))
		if err != nil {
			t.Fatal(err)
		}
		// --dry-run first: these flags must never reach the host's iptables.
		code, out, errOut := runIptables(t, c.Env, c.Inputs.HostFamily, c.Inputs.Nameservers, append([]string{"istio-iptables", "--dry-run"}, c.Flags...)...)
		if code != 0 {
			t.Errorf("%s: exit %d: %s", c.Name, code, errOut)
			continue
		}
		var got []string
		for _, l := range strings.Split(out, "\n") {
			if l != "" && !strings.HasPrefix(l, "#") {
				got = append(got, l)
			}
		}
		var want []string
		for _, l := range strings.Split(strings.TrimSpace(string(golden)), "\n") {
			if !strings.HasSuffix(l, "tables-save") {
				want = append(want, l)
			}
		}
		gotText, wantText := strings.Join(got, "\n"), strings.Join(want, "\n")
		switch {
		case gotText == wantText:
			exact++
		case c.Name == "dns-uid-gid" && strings.ReplaceAll(gotText, "::7f00:35/128", "::127.0.0.53/128") == wantText:
		default:
			t.Errorf("%s: CLI output differs from golden:\n%s\n---\n%s", c.Name, gotText, wantText)
		}
	}
	if exact != 29 {
		t.Errorf("%d of 30 cases match exactly, want 29", exact)
	}
}

func TestIstioIptablesEnvBinding(t *testing.T) {
	// Env sets a default; the command line wins.
	_, out, _ := runIptables(t, map[string]string{"ISTIO_INBOUND_PORTS": "4000", "INBOUND_CAPTURE_PORT": "16006"}, "ipv4", nil,
		"istio-iptables", "--dry-run")
	if !strings.Contains(out, "--dport 4000 -j ISTIO_IN_REDIRECT") || !strings.Contains(out, "--to-ports 16006") {
		t.Errorf("env not bound:\n%s", out)
	}
	_, out, _ = runIptables(t, map[string]string{"ISTIO_INBOUND_PORTS": "4000"}, "ipv4", nil, "istio-iptables", "--dry-run", "-b", "5000")
	if strings.Contains(out, "4000") || !strings.Contains(out, "--dport 5000") {
		t.Errorf("command line did not win over env:\n%s", out)
	}
	// --envoy-port has no env binding.
	_, out, _ = runIptables(t, map[string]string{"ENVOY_PORT": "19999"}, "ipv4", nil, "istio-iptables", "--dry-run")
	if strings.Contains(out, "19999") || !strings.Contains(out, "--to-ports 15001") {
		t.Errorf("ENVOY_PORT was bound:\n%s", out)
	}
	// Aliases: ISTIO_META_DNS_CAPTURE turns on DNS capture; INVALID_DROP drop-invalid.
	_, out, _ = runIptables(t, map[string]string{"ISTIO_META_DNS_CAPTURE": "true", "INVALID_DROP": "true"}, "ipv4", []string{"10.96.0.10"},
		"istio-iptables", "--dry-run")
	if !strings.Contains(out, "-d 10.96.0.10/32 -j REDIRECT --to-ports 15053") || !strings.Contains(out, "-j ISTIO_DROP") {
		t.Errorf("env aliases not honoured:\n%s", out)
	}
	// GID defaults to UID.
	_, out, _ = runIptables(t, nil, "ipv4", nil, "istio-iptables", "--dry-run", "-u", "2000")
	if !strings.Contains(out, "--gid-owner 2000") {
		t.Errorf("gid does not default to uid:\n%s", out)
	}
}

func TestIstioIptablesBadInput(t *testing.T) {
	for _, tc := range []struct {
		Env  map[string]string
		args []string
		want []string
	}{
		{nil, []string{"-p", "0"}, []string{"--envoy-port", `"0"`}},
		{nil, []string{"-b", "80,http"}, []string{"--istio-inbound-ports", "80,http"}},
		{nil, []string{"-i", "10.0.0.0/99"}, []string{"--istio-service-cidr", "10.0.0.0/99"}},
		{nil, []string{"-x", "*"}, []string{"--istio-service-exclude-cidr"}},
		{nil, []string{"-m", "NAT"}, []string{"--istio-inbound-interception-mode", "NAT"}},
		{nil, []string{"-u", "root"}, []string{"--proxy-uid", "root"}},
		{nil, []string{"-c", "this-name-is-too-long"}, []string{"--istio-exclude-interfaces", "this-name-is-too-long"}},
		{map[string]string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "10.0.0.0/8"}, nil, []string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "10.0.0.0/8"}},
		{map[string]string{"REDIRECT_DNS": "maybe"}, nil, []string{"REDIRECT_DNS", "maybe"}},
		{nil, []string{"--iptables-trace-logging"}, []string{"unknown flag"}},
		{nil, []string{"--probe-timeout", "soon"}, []string{"probe-timeout", "soon"}},
	} {
		// Not --dry-run: bad input must stop before anything is touched.
		code, out, errOut := runIptables(t, tc.Env, "ipv4", nil, append([]string{"istio-iptables"}, tc.args...)...)
		if code != 2 {
			t.Errorf("%v %v: exit %d, want 2 (stderr %q)", tc.Env, tc.args, code, errOut)
		}
		if out != "" {
			t.Errorf("%v: printed %q", tc.args, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v %v: error %q does not name %q", tc.Env, tc.args, errOut, w)
			}
		}
	}
}

// TestIstioIptablesNoLocalIP: with no usable address (a bare namespace)
// Istio exits 1; meshagent warns and programs IPv4 only.
func TestIstioIptablesNoLocalIP(t *testing.T) {
	var stdout, stderr bytes.Buffer
	host := config.Host{Env: config.MapEnvironment(nil), ResolvConf: "/nonexistent/resolv.conf",
		InterfaceAddrs: func() ([]netip.Prefix, error) { return []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")}, nil }}
	cmd := newIstioIptablesCommand(host)
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"--dry-run", "-i", "*"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr.String(), "IPv4 rules only") || !strings.Contains(stdout.String(), "-A ISTIO_OUTPUT -j ISTIO_REDIRECT") ||
		strings.Contains(stdout.String(), "::6/128") {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
}

// TestIstioIptablesHelperProcess is not a test: it runs the CLI for the
// tests below in a child process (as another user, or with another PATH).
func TestIstioIptablesHelperProcess(t *testing.T) {
	if os.Getenv("MESHAGENT_IPTABLES_HELPER") != "1" {
		return
	}
	if os.Getenv("MESHAGENT_IPTABLES_NETNS") == "1" {
		// Fresh namespace: give it a non-loopback address (as Istio's tests
		// do), then, if asked, run the CLI as another user.
		for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", "240.240.240.240/32", "dev", "lo"}} {
			if out, err := exec.Command(os.Getenv("MESHAGENT_IP_BIN"), args...).CombinedOutput(); err != nil {
				os.Stderr.Write(out)
				os.Exit(3)
			}
		}
		if uid := os.Getenv("MESHAGENT_IPTABLES_UID"); uid != "" {
			cmd := exec.Command(os.Args[0], os.Args[1:]...)
			cmd.Env = append(os.Environ(), "MESHAGENT_IPTABLES_NETNS=0")
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			err := cmd.Run()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				os.Exit(ee.ExitCode())
			}
			os.Exit(0)
		}
	}
	if cmds := os.Getenv("MESHAGENT_IPTABLES_SEQ"); cmds != "" {
		// Several commands in this one namespace (runChildSeq): each one's
		// exit code printed after its output.
		for _, c := range strings.Split(cmds, "\x1e") {
			fmt.Printf("\n#exit=%d\n", run(strings.Split(c, "\x1f"), os.Stdout, os.Stdout))
		}
		os.Exit(0)
	}
	args := strings.Split(os.Getenv("MESHAGENT_IPTABLES_ARGS"), "\x1f")
	os.Exit(run(args, os.Stdout, os.Stderr))
}

// runChildSeq runs several CLI commands one after the other in one fresh
// network namespace and returns each one's exit code and output.
func runChildSeq(t *testing.T, cmds ...[]string) (codes []int, outs []string) {
	t.Helper()
	var joined []string
	for _, c := range cmds {
		joined = append(joined, strings.Join(c, "\x1f"))
	}
	_, out := runChild(t, false, []string{"MESHAGENT_IPTABLES_SEQ=" + strings.Join(joined, "\x1e")})
	var cur strings.Builder
	for _, l := range strings.SplitAfter(out, "\n") {
		if code, ok := strings.CutPrefix(l, "#exit="); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(code))
			codes, outs = append(codes, n), append(outs, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteString(l)
	}
	if len(codes) != len(cmds) {
		t.Fatalf("%d of %d commands ran:\n%s", len(codes), len(cmds), out)
	}
	return codes, outs
}

func runChild(t *testing.T, asNobody bool, env []string, args ...string) (int, string) {
	t.Helper()
	testkit.RequireRoot(t, "runs the CLI in a new network namespace")
	bin := os.Args[0]
	if asNobody { // test binaries sit in 0700 dirs: copy for other users
		dir := testkit.ShortTempDir(t, "meshagent-bin-")
		os.Chmod(dir, 0o755)
		data, _ := os.ReadFile(os.Args[0])
		bin = filepath.Join(dir, "meshagent.test")
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "-test.run", "^TestIstioIptablesHelperProcess$")
	cmd.Env = append(append(os.Environ(), env...), "MESHAGENT_IPTABLES_HELPER=1", "MESHAGENT_IPTABLES_ARGS="+strings.Join(args, "\x1f"))
	// The child gets its own network namespace: should anything reach
	// iptables, it cannot touch the host's rules.
	ipBin, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("needs ip (iproute2)")
	}
	cmd.Env = append(cmd.Env, "MESHAGENT_IPTABLES_NETNS=1", "MESHAGENT_IP_BIN="+ipBin)
	if asNobody {
		cmd.Env = append(cmd.Env, "MESHAGENT_IPTABLES_UID=65534")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, string(out)
}

func TestIstioIptablesMissingBinary(t *testing.T) {
	code, out := runChild(t, false, []string{"PATH=" + t.TempDir()}, "istio-iptables", "-i", "*", "-b", "*")
	if code != 1 || !strings.Contains(out, "iptables not found") || strings.Contains(out, "goroutine ") {
		t.Errorf("exit %d, output %q; want exit 1 naming the missing iptables, no stack trace", code, out)
	}
}

func TestIstioIptablesNotRoot(t *testing.T) {
	testkit.RequireRoot(t, "to start a child as another user", "iptables")
	code, out := runChild(t, true, nil, "istio-iptables", "-i", "*", "-b", "*")
	t.Logf("as uid 65534: exit %d: %s", code, out)
	if code != 1 || !strings.Contains(out, "permission denied") || strings.Contains(out, "goroutine ") {
		t.Errorf("exit %d, output %q; want exit 1 with a permission error, no stack trace", code, out)
	}
}

// TestIstioIptablesValidationExit126: as root the probe is not redirected
// (only the proxy UID's loopback calls are), so validation times out: 126.
func TestIstioIptablesValidationExit126(t *testing.T) {
	code, out := runChild(t, false, nil, "istio-iptables", "-i", "*", "-b", "*", "--run-validation", "--probe-timeout", "1500ms")
	if code != 126 || !strings.Contains(out, "validation failed") {
		t.Errorf("exit %d, output %q; want 126", code, out)
	}
}

// TestIstioIptablesApplyAndCleanupInNetns: the real command in a fresh
// namespace applies the sidecar rules (the capture package's kernel tests
// cover re-runs, cleanup and traffic).
func TestIstioIptablesApplyAndCleanupInNetns(t *testing.T) {
	args := append([]string{}, sidecarArgs[:len(sidecarArgs)-1]...) // without --dry-run
	code, out := runChild(t, false, nil, args...)
	if code != 0 || !strings.Contains(out, "outcome=applied") {
		t.Errorf("apply: exit %d: %s", code, out)
	}
}
