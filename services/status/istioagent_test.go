package status

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/services/status/appprobe"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// Istio's own agent, run beside ours on the same inputs (make conformance).
// Its binary is MESHAGENT_ISTIO_AGENT, or the one the peers' build.sh
// leaves in ~/.cache/meshagent-peers; the tests skip without it.

// istioAgentBinary is the path of Istio's pilot-agent, or "" with why not.
func istioAgentBinary() (string, string) { return testkit.IstioAgentBinary() }

// istioAgent is a running pilot-agent.
type istioAgent struct {
	statusURL string
	cmd       *exec.Cmd
	log       *testkit.LogBuffer
}

// startIstioAgent runs `pilot-agent proxy sidecar` in a temp dir with
// file-mounted dev certificates (it exits at start without a root
// certificate), no cloud metadata lookups and no control plane, and waits
// for its status port. proxyConfig adds fields to its PROXY_CONFIG
// (`,"binaryPath":"..."`); env adds to or overrides its environment.
func startIstioAgent(t testing.TB, binary, proxyConfig string, env ...string) *istioAgent {
	t.Helper()
	dir := t.TempDir()
	gen := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "run", "../../testdata/devcerts", "-out", filepath.Join(dir, "etc", "certs"))
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("devcerts: %v\n%s", err, out)
	}
	statusPort, adminPort := testkit.FreePort(t), testkit.FreePort(t)
	a := &istioAgent{statusURL: "http://127.0.0.1:" + strconv.Itoa(statusPort), log: &testkit.LogBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	a.cmd = exec.CommandContext(ctx, binary, "proxy", "sidecar")
	a.cmd.Dir = dir
	a.cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"FILE_MOUNTED_CERTS=true",
		"CLOUD_PLATFORM=none",
		"DISABLE_ENVOY=true",
		"INSTANCE_IP=127.0.0.1",
		"POD_NAME=differential",
		"POD_NAMESPACE=default",
		fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"discoveryAddress":"127.0.0.1:1","controlPlaneAuthPolicy":"NONE"%s}`,
			statusPort, adminPort, proxyConfig),
	}, env...)
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	a.cmd.Cancel = func() error { return a.cmd.Process.Signal(syscall.SIGTERM) }
	a.cmd.WaitDelay = 10 * time.Second
	if err := a.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- a.cmd.Wait() }()
	t.Cleanup(func() {
		cancel()
		<-exited
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(a.statusURL + "/healthz/ready")
		if err == nil {
			resp.Body.Close()
			return a
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("Istio's agent exited at start: %v\n%s", err, a.log.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("Istio's agent did not open its status port in 30s:\n%s", a.log.String())
		}
	}
}

// runIstioAgentToExit runs pilot-agent with env and returns how it ended,
// for configurations it must refuse at start.
func runIstioAgentToExit(t *testing.T, binary string, env ...string) (exited bool, code int, log string) {
	t.Helper()
	dir := t.TempDir()
	gen := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "run", "../../testdata/devcerts", "-out", filepath.Join(dir, "etc", "certs"))
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("devcerts: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "proxy", "sidecar")
	cmd.Dir = dir
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "FILE_MOUNTED_CERTS=true", "CLOUD_PLATFORM=none",
		"DISABLE_ENVOY=true", "INSTANCE_IP=127.0.0.1", "POD_NAME=differential", "POD_NAMESPACE=default",
		fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"discoveryAddress":"127.0.0.1:1","controlPlaneAuthPolicy":"NONE"}`,
			testkit.FreePort(t), testkit.FreePort(t)),
	}, env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	out, _ := cmd.CombinedOutput() // the exit status is the point
	if ctx.Err() != nil {
		return false, 0, string(out)
	}
	return true, cmd.ProcessState.ExitCode(), string(out)
}

// differentialApps are the applications both agents probe.
func differentialApps(t *testing.T) (httpPort, tcpPort, grpcPort, closed int) {
	t.Helper()
	other := testkit.FreePort(t) // a redirect target on another host name
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "fine") })
	mux.HandleFunc("/fail", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "down")
	})
	mux.HandleFunc("/notfound", http.NotFound)
	mux.HandleFunc("/big", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, strings.Repeat("b", 20<<10)) })
	mux.HandleFunc("/same-host", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/fail", http.StatusFound) })
	mux.HandleFunc("/other-host", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, fmt.Sprintf("http://localhost:%d/", other), http.StatusFound)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	mux.HandleFunc("/no-location", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusFound) })
	mux.HandleFunc("/hang", func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(20 * time.Second):
		}
	})
	mux.HandleFunc("/echo-host", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Host) })
	app := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = app.Serve(ln) }()
	t.Cleanup(func() { app.Close() })

	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testkit.AcceptAndClose(t, tcp)
	grpcPort = startHealthServer(t)
	return ln.Addr().(*net.TCPAddr).Port, tcp.Addr().(*net.TCPAddr).Port, grpcPort, closedPort(t)
}

// TestDifferentialAppProbes gives Istio's agent and ours the same
// ISTIO_KUBE_APP_PROBERS and applications and compares what kubelet would
// get for every probe path, configured or not.
func TestDifferentialAppProbes(t *testing.T) {
	binary, why := istioAgentBinary()
	if binary == "" {
		t.Skip(why)
	}
	httpPort, tcpPort, grpcPort, closed := differentialApps(t)
	probes := map[string]string{}
	for _, p := range []string{"ok", "fail", "notfound", "big", "same-host", "other-host", "loop", "no-location", "hang", "echo-host"} {
		probes["/app-health/http-"+p+"/livez"] = fmt.Sprintf(`{"httpGet":{"path":"/%s","port":%d,"scheme":"HTTP"},"timeoutSeconds":1}`, p, httpPort)
	}
	probes["/app-health/http-closed/readyz"] = fmt.Sprintf(`{"httpGet":{"path":"/","port":%d},"timeoutSeconds":1}`, closed)
	probes["/app-lifecycle/http-ok/prestopz"] = fmt.Sprintf(`{"httpGet":{"path":"ok","port":%d},"timeoutSeconds":1}`, httpPort)
	probes["/app-health/tcp-up/readyz"] = fmt.Sprintf(`{"tcpSocket":{"port":%d},"timeoutSeconds":1}`, tcpPort)
	probes["/app-health/tcp-closed/readyz"] = fmt.Sprintf(`{"tcpSocket":{"port":%d},"timeoutSeconds":1}`, closed)
	probes["/app-health/grpc-all/startupz"] = fmt.Sprintf(`{"grpc":{"port":%d},"timeoutSeconds":1}`, grpcPort)
	probes["/app-health/grpc-db/startupz"] = fmt.Sprintf(`{"grpc":{"port":%d,"service":"db"},"timeoutSeconds":1}`, grpcPort)
	probes["/app-health/grpc-cache/startupz"] = fmt.Sprintf(`{"grpc":{"port":%d,"service":"cache"},"timeoutSeconds":1}`, grpcPort)
	probes["/app-health/grpc-unknown/startupz"] = fmt.Sprintf(`{"grpc":{"port":%d,"service":"unknown"},"timeoutSeconds":1}`, grpcPort)
	probes["/app-health/grpc-closed/startupz"] = fmt.Sprintf(`{"grpc":{"port":%d},"timeoutSeconds":1}`, closed)
	var parts []string
	for path, p := range probes {
		parts = append(parts, strconv.Quote(path)+":"+p)
	}
	value := "{" + strings.Join(parts, ",") + "}"

	istio := startIstioAgent(t, binary, "", appprobe.AppProbersEnv+"="+value)
	ours := newFixture(Config{Probes: appprobe.Config{Host: "127.0.0.1", App: probers(t, value)}})
	oursURL := ours.serve(t)

	paths := make([]string, 0, len(probes)+6)
	for path := range probes {
		paths = append(paths, path)
	}
	sort.Strings(paths)
	paths = append(paths, "/app-health/unknown/livez", "/app-health/http-ok/deadz", "/app-health/",
		"/app-lifecycle/unknown/poststartz", "/app-health/http-ok/livez/extra", "/app-health/http-ok")
	differences := 0
	for _, path := range paths {
		ic, ib := get(t, istio.statusURL+path)
		oc, ob := get(t, oursURL+path)
		same := ic == oc
		// Bodies are the application's for HTTP probes; a 400's text is
		// each agent's own.
		if ic != http.StatusBadRequest && ib != ob {
			same = false
		}
		mark := "same"
		if !same {
			mark = "DIFFERENT"
			differences++
			t.Errorf("%s: Istio %d %.40q, ours %d %.40q", path, ic, ib, oc, ob)
		}
		t.Logf("%-36s Istio %d  ours %d  %s", path, ic, oc, mark)
	}
	t.Logf("%d paths, %d differences", len(paths), differences)
}

// Both agents refuse the same bad ISTIO_KUBE_APP_PROBERS at start.
func TestDifferentialBadAppProbers(t *testing.T) {
	binary, why := istioAgentBinary()
	if binary == "" {
		t.Skip(why)
	}
	for name, value := range map[string]string{
		"bad path":   `{"/healthz/x/livez":{"tcpSocket":{"port":8080}}}`,
		"two kinds":  `{"/app-health/x/livez":{"tcpSocket":{"port":8080},"httpGet":{"port":8080}}}`,
		"named port": `{"/app-health/x/livez":{"httpGet":{"port":"http"}}}`,
		"not JSON":   `{"/app-health/x/livez":`,
	} {
		t.Run(name, func(t *testing.T) {
			_, ourErr := appprobe.ParseAppProbers(value)
			exited, code, log := runIstioAgentToExit(t, binary, appprobe.AppProbersEnv+"="+value)
			if !exited || code == 0 {
				t.Errorf("Istio's agent accepted %s (exited %v, code %d)\n%s", value, exited, code, log)
			}
			if ourErr == nil {
				t.Errorf("ours accepted %s", value)
			}
			t.Logf("Istio: exit %d; ours: %v", code, ourErr)
		})
	}
}

// TestDifferentialCompression asks Istio's agent and ours the same paths
// with the same Accept-Encoding and compares the Content-Encoding each
// answers with (#35: Istio 1.30's gzhttp over its whole status mux): an
// application probe's 20 KiB answer, a short one, readiness, a 400, the
// merged metrics, by GET and by HEAD.
func TestDifferentialCompression(t *testing.T) {
	binary, why := istioAgentBinary()
	if binary == "" {
		t.Skip(why)
	}
	httpPort, _, _, _ := differentialApps(t)
	value := fmt.Sprintf(`{"/app-health/big/livez":{"httpGet":{"path":"/big","port":%d}},"/app-health/ok/livez":{"httpGet":{"path":"/ok","port":%d}}}`,
		httpPort, httpPort)
	istio := startIstioAgent(t, binary, "", appprobe.AppProbersEnv+"="+value)
	ours := newFixtureIn(Config{Probes: appprobe.Config{Host: "127.0.0.1", App: probers(t, value)}}, Inputs{Metrics: agentRegistry()})
	oursURL := ours.serve(t)
	// The raw answer: no client decompression, one connection each.
	raw := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}, Timeout: 10 * time.Second}
	encoding := func(method, url, accept string) (string, bool) {
		t.Helper()
		req, err := http.NewRequest(method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if accept != "-" {
			req.Header.Set("Accept-Encoding", accept)
		}
		resp, err := raw.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Header.Get("Content-Encoding"), strings.Contains(resp.Header.Get("Vary"), "Accept-Encoding")
	}
	differences, compared := 0, 0
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		for _, path := range []string{"/app-health/big/livez", "/app-health/ok/livez", "/healthz/ready", "/app-health/none/livez", "/stats/prometheus"} {
			for _, accept := range []string{"zstd", "gzip", "gzip, zstd", "zstd;q=0.5, gzip", "gzip, deflate, br, zstd", "br", "identity", "gzip;q=0", "-"} {
				ie, iv := encoding(method, istio.statusURL+path, accept)
				oe, ov := encoding(method, oursURL+path, accept)
				compared++
				if ie != oe || iv != ov {
					differences++
					t.Errorf("%s %s, Accept-Encoding %q: Istio %q (Vary %v), ours %q (Vary %v)", method, path, accept, ie, iv, oe, ov)
				}
			}
		}
	}
	t.Logf("%d requests, %d differences", compared, differences)
}
