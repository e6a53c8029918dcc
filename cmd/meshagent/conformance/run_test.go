package conformance

// How the differential conformance suite runs an agent on a case: Istio's
// pilot-agent or meshagent, for real, each in its own network and mount
// namespace (a veth "eth0" holding the pod's addresses, loopback up, a
// resolv.conf naming only 127.0.0.1 so that no DNS query leaves the
// namespace); or meshagent's configuration pipeline in-process, for `make
// test`. Envoy is the stand-in, told to record its command line and
// bootstrap (FAKE_ENVOY_RECORD).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/envoy/bootstrap"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/services/sds"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/tree"
)

// confOutput is what one agent did with a case.
type confOutput struct {
	// Outcome: "started envoy", "exit 0", "exit non-zero", or "still
	// running" (neither within the time allowed).
	Outcome  string `json:"outcome"`
	ExitCode int    `json:"exit_code,omitempty"`
	// Args and the bootstrap are Envoy's, as the stand-in recorded them.
	Args          []string        `json:"args,omitempty"`
	Bootstrap     json.RawMessage `json:"bootstrap,omitempty"`
	BootstrapYAML string          `json:"bootstrap_yaml,omitempty"`
	// Status are the answers of a status case, in request order.
	Status []statusAnswer `json:"status,omitempty"`

	norm normalizer // how to read the paths in it
	log  string     // the agent's output, for failures
}

type statusAnswer struct {
	Request string `json:"request"`
	Code    int    `json:"code"`
}

const (
	outcomeStarted = "started envoy"
	outcomeExit0   = "exit 0"
	outcomeFailed  = "exit non-zero"
	outcomeRunning = "still running"
)

func exitOutcome(code int) string {
	if code == 0 {
		return outcomeExit0
	}
	return outcomeFailed
}

func (o confOutput) bootstrap() recordedBootstrap {
	if o.BootstrapYAML != "" {
		return recordedBootstrap{data: []byte(o.BootstrapYAML), yaml: true}
	}
	return recordedBootstrap{data: o.Bootstrap}
}

// liveEnv is what live runs need: the binaries and Istio's source.
type liveEnv struct {
	istioAgent string // Istio's pilot-agent
	istioSrc   string // Istio's source (its template, its golden inputs)
}

// prepareRoot writes what an agent reads from its directory: file-mounted
// dev certificates, the case's inputs, and a world-writable record
// directory for the stand-in Envoy (Envoy may run as 1337).
func prepareRoot(t *testing.T, c confCase, root, istioSrc string) (record string) {
	t.Helper()
	if out, err := exec.Command(e2ekit.DevcertsBinary, "-out", filepath.Join(root, "etc/certs"), "-namespace", "conformance").CombinedOutput(); err != nil {
		t.Fatalf("devcerts: %v\n%s", err, out)
	}
	if err := c.writeInputs(root, istioSrc); err != nil {
		t.Fatalf("case %s: %v", c.Name, err)
	}
	record = filepath.Join(root, "record")
	if err := os.Mkdir(record, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(record, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "resolv.conf"), []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return record
}

// netnsScript runs a command in a fresh network and mount namespace made
// to look like a pod: lo up, eth0 with the pod's addresses (its veth peer
// left down), /etc/resolv.conf replaced by one naming only 127.0.0.1.
// Arguments: resolv.conf, the addresses, "--", the command.
const netnsScript = `set -e
resolv=$1; shift
ip link set lo up
ip link add eth0 type veth peer name peer0
while [ "$1" != "--" ]; do
	case "$1" in
	*:*) ip -6 addr add "$1" dev eth0 nodad ;;
	*) ip addr add "$1" dev eth0 ;;
	esac
	shift
done
shift
ip link set eth0 up
mount --bind "$resolv" /etc/resolv.conf
exec "$@"`

// runAgentCase runs one agent binary on a bootstrap or exit case and
// returns what it did: it started Envoy (the record appears; the agent is
// then killed) or it exited. ours adds --root to `proxy`.
func runAgentCase(t *testing.T, c confCase, binary string, ours, netns bool, istioSrc string) confOutput {
	t.Helper()
	root := testkit.ShortTempDir(t, "cf")
	record := prepareRoot(t, c, root, istioSrc)
	env := c.environment(root, e2ekit.EnvoyBinary)
	env["FAKE_ENVOY_RECORD"] = record
	env["FAKE_ENVOY_RECORD_EXIT"] = "0"
	env["PATH"] = os.Getenv("PATH")
	env["HOME"] = root
	args := c.command(root)
	if ours && c.isProxy() {
		args = append(args, "--root", root)
	}
	name, argv := binary, args
	for _, a := range c.addrs() {
		if _, err := netip.ParsePrefix(a); err != nil {
			t.Fatalf("case %s: pod address %q: %v", c.Name, a, err)
		}
	}
	if netns {
		name = "unshare"
		argv = append([]string{"--net", "--mount", "--", "sh", "-c", netnsScript, "sh", filepath.Join(root, "resolv.conf")}, c.addrs()...)
		argv = append(append(argv, "--", binary), args...)
	}
	cmd, log, exited := startCase(t, root, env, name, argv...)

	out := confOutput{norm: normalizer{Root: root, envoy: e2ekit.EnvoyBinary}}
	argsFile := filepath.Join(record, "args.json")
	deadline := time.After(30 * time.Second)
wait:
	for {
		select {
		case err := <-exited:
			if _, statErr := os.Stat(argsFile); statErr == nil {
				out.Outcome = outcomeStarted
				break wait
			}
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatalf("%s: %v", binary, err)
			}
			out.Outcome, out.ExitCode = exitOutcome(code), code
			out.log = log.String()
			return out
		case <-deadline:
			_ = cmd.Process.Kill()
			<-exited
			out.Outcome, out.log = outcomeRunning, log.String()
			return out
		case <-time.After(5 * time.Millisecond):
			if _, err := os.Stat(argsFile); err == nil {
				_ = cmd.Process.Kill()
				<-exited
				out.Outcome = outcomeStarted
				break wait
			}
		}
	}
	out.log = log.String()
	readRecord(t, record, &out)
	return out
}

// readRecord reads what the stand-in Envoy recorded.
func readRecord(t *testing.T, record string, out *confOutput) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(record, "args.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &out.Args); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(record, "bootstrap.json")); err == nil {
		out.Bootstrap = b
	} else if b, err := os.ReadFile(filepath.Join(record, "bootstrap.yaml")); err == nil {
		out.BootstrapYAML = string(b)
	}
}

// runOursInProcess runs a bootstrap case through meshagent's configuration
// pipeline in this process, on a host made to look like the namespace of a
// live run, and writes the bootstrap as the envoy service would at Envoy's
// start. `make conformance` checks that this gives what the binary gives.
func runOursInProcess(t *testing.T, c confCase, istioSrc string) confOutput {
	t.Helper()
	root := testkit.ShortTempDir(t, "cf")
	prepareRoot(t, c, root, istioSrc)
	env := c.environment(root, "<envoy>")
	addrs := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("::1/128")}
	for _, a := range c.addrs() {
		addrs = append(addrs, netip.MustParsePrefix(a))
	}
	addrs = append(addrs, netip.MustParsePrefix("fe80::1/64")) // eth0's link-local address
	host := config.Host{
		Env:            config.MapEnvironment(env),
		EUID:           0,
		InterfaceAddrs: func() ([]netip.Prefix, error) { return addrs, nil },
		LookupUID:      func(string) (string, error) { return "", errors.New("no users here") },
		ResolvConf:     filepath.Join(root, "resolv.conf"),
		FileExists:     func(p string) bool { _, err := os.Stat(p); return err == nil },
		SocketLive:     sds.SocketLive,
	}
	out := confOutput{norm: normalizer{Root: root, envoy: "<envoy>"}}
	// The proxy command's arguments; relative paths are the agent's
	// working directory's, as in a live run.
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chdir(root); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.Chdir(wd) }()
	cfg, err := configure(host, append(c.command(root)[1:], "--root", root))
	if err != nil {
		out.Outcome, out.ExitCode, out.log = outcomeFailed, 2, err.Error()
		return out
	}
	ec := cfg.Tree.Envoy
	if ec == nil {
		out.Outcome, out.log = outcomeRunning, "no Envoy (DISABLE_ENVOY)"
		return out
	}
	// As the envoy service does: New validates, the first start renders.
	err = ec.Bootstrap.Validate()
	var r *bootstrap.Rendered
	if err == nil {
		r, err = bootstrap.Render(*ec.Bootstrap)
	}
	if err != nil {
		out.Outcome, out.ExitCode, out.log = outcomeFailed, 1, err.Error()
		return out
	}
	b := r.File
	out.Outcome, out.Args = outcomeStarted, envoy.CommandLine(ec.Args, b)
	data, err := os.ReadFile(b.Path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(b.Path, ".yaml") {
		out.BootstrapYAML = string(data)
		return out
	}
	out.Bootstrap = data
	if !needsIstioSource(c) {
		// The comparison with Istio's output reads both leniently (Istio's template may name
		// fields our Envoy types lack); ours must also load strictly, as a built-in bootstrap
		// is built as plain JSON (services/envoy/bootstrap/json.go).
		strict := &bootstrapv3.Bootstrap{}
		if err := protojson.Unmarshal(data, strict); err != nil {
			t.Fatalf("our bootstrap does not load strictly into Envoy's Bootstrap: %v", err)
		}
		if err := strict.ValidateAll(); err != nil {
			t.Fatalf("our bootstrap fails Envoy's validation: %v", err)
		}
	}
	return out
}

// runStatusCase runs an agent with the stand-in Envoy serving, on ports of
// its own, and makes the case's requests in order.
func runStatusCase(t *testing.T, c confCase, binary string, ours bool, istioSrc string) confOutput {
	t.Helper()
	root := testkit.ShortTempDir(t, "cs")
	record := prepareRoot(t, c, root, istioSrc)
	ports := e2ekit.FreePorts(t, 5)
	status, admin, envoyStatus, envoyProm, xds := ports[0], ports[1], ports[2], ports[3], ports[4]
	c.ProxyConfig = fmt.Sprintf(`{"statusPort":%d,"proxyAdminPort":%d,"discoveryAddress":"127.0.0.1:%d","controlPlaneAuthPolicy":"NONE","terminationDrainDuration":"1s"}`,
		status, admin, xds)
	env := c.environment(root, e2ekit.EnvoyBinary)
	env["ENVOY_STATUS_PORT"] = strconv.Itoa(envoyStatus)
	env["ENVOY_PROMETHEUS_PORT"] = strconv.Itoa(envoyProm)
	env["FAKE_ENVOY_RECORD"] = record
	env["PATH"] = os.Getenv("PATH")
	env["HOME"] = root
	args := c.command(root)
	if ours {
		args = append(args, "--root", root)
	}
	cmd, log, exited := startCase(t, root, env, binary, args...)
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		}
	}()
	out := confOutput{log: ""}
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(method, url string) int {
		req, _ := http.NewRequestWithContext(context.Background(), method, url, nil)
		resp, err := client.Do(req)
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// Both agents in the same state: the status server up, Envoy started,
	// its admin API answering. Its bootstrap's listeners (15021) do not
	// listen before Envoy has its configuration: Envoy's listeners listen
	// once its workers start, and so do the stand-in's (#36).
	deadline := time.Now().Add(30 * time.Second)
	for get("GET", fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", status)) == 0 ||
		get("GET", fmt.Sprintf("http://127.0.0.1:%d/ready", admin)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not start its status server and Envoy in 30s:\n%s", binary, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, r := range c.Requests {
		method, target, _ := strings.Cut(r, " ")
		url := fmt.Sprintf("http://127.0.0.1:%d%s", status, target)
		if p, ok := strings.CutPrefix(target, "envoy:"); ok {
			url = fmt.Sprintf("http://127.0.0.1:%d%s", envoyStatus, p)
		}
		out.Status = append(out.Status, statusAnswer{Request: r, Code: get(method, url)})
		if r == "POST /quitquitquit" {
			code := -1
			select {
			case err := <-exited:
				exited <- err
				code = 0
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					code = ee.ExitCode()
				}
			case <-time.After(15 * time.Second):
			}
			out.Status = append(out.Status, statusAnswer{Request: "exit code after POST /quitquitquit", Code: code})
		}
	}
	out.log = log.String()
	return out
}

// startCase starts name with argv in root with exactly env, its output
// in log; exited receives the result of its Wait.
func startCase(t *testing.T, root string, env map[string]string, name string, argv ...string) (cmd *exec.Cmd, log *testkit.LogBuffer, exited chan error) {
	t.Helper()
	cmd = exec.Command(name, argv...)
	cmd.Dir = root
	cmd.Env = envList(env)
	log = &testkit.LogBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited = make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return cmd, log, exited
}

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		if v != "" {
			out = append(out, k+"="+v)
		}
	}
	return out
}

// configure runs a `proxy` command line (its arguments after "proxy")
// through the configuration on host as `meshagent proxy` does
// (cmd/meshagent/proxy.go), through package config's API: the command's
// flags and Istio's logging flags (unknown ones tolerated), the
// environment, config.Build, then the services' own checks (tree.Build,
// which runs nothing). A bad value gives the error the binary prints
// before it exits 2.
func configure(host config.Host, args []string) (*config.Plan, error) {
	fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
	fs.ParseErrorsWhitelist.UnknownFlags = true
	fs.SetOutput(io.Discard)
	f := &config.ProxyFlags{}
	s := config.NewSettings(fs)
	config.BindProxyFlags(s, f)
	level := fs.String("log_output_level", "default:info", "")
	asJSON := fs.Bool("log_as_json", false, "")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	_ = s.Resolve(host.Env) // bad values stay in s.Problems, reported by Build
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	cfg, err := config.Build(config.Inputs{Flags: f, Args: fs.Args(), LogLevel: *level, LogAsJSON: *asJSON,
		Version: e2ekit.E2EVersion, Host: host, Problems: s.Problems, Log: log})
	if err != nil {
		return nil, err
	}
	if _, _, err := tree.Build(cfg.Tree, log, tree.Process{Clock: messages.SystemClock{}, Metrics: reg}); err != nil {
		return nil, err
	}
	return cfg, nil
}
