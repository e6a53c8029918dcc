// Command attack runs the attack classes of issue #33 against a built agent
// and prints the agent's peak memory under each beside its bound; it exits
// 1 if the agent dies, stops answering, or passes a bound. hack/attack.sh
// (make attack) builds the binaries, makes the network namespace and the
// memory cgroup, and runs it inside them; it is not meant to be run alone.
//
// Each attack is bounded in count and time. The agent runs `meshagent
// proxy` with the stand-in Envoy, hot restart on, a slow application behind
// its probes, against bench/agent/controlplane (which also makes the large
// pushes). Peaks are the agent's own (VmHWM, reset before each attack
// through /proc/PID/clear_refs) and its cgroup's (memory.max_usage_in_bytes,
// the agent and Envoy).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit"
)

var (
	agentBin = flag.String("agent", "bin/meshagent", "the agent binary")
	envoyBin = flag.String("envoy", "bin/fakeenvoy", "the stand-in Envoy binary")
	cpBin    = flag.String("controlplane", "", "bench/agent/controlplane, built")
	certs    = flag.String("certs", "", "a directory of cert-chain.pem, key.pem, root-cert.pem (testdata/devcerts)")
	work     = flag.String("work", "", "a scratch directory")
	cgroup   = flag.String("cgroup", "", "the v1 memory cgroup directory to run the agent in")
	limit    = flag.Int64("limit-mib", 1024, "the cgroup's memory limit: Istio's default sidecar limit, 1 GiB")
	pushMiB  = flag.Int("push-mib", 32, "the size of the single CDS push")
	names    = flag.Int("names", 200000, "the NDS table's names")
)

// row is one attack's outcome.
type row struct {
	name            string
	agentMiB, cgMiB int64
	boundMiB        int64
	note            string
	failed          bool
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "attack:", err)
		os.Exit(1)
	}
}

type agent struct {
	cmd                  *exec.Cmd
	pid                  int
	status, admin        int
	root, binary, stderr string
	cp                   *controlPlane
}

func run() error {
	for _, f := range []string{*cpBin, *certs, *work, *cgroup} {
		if f == "" {
			return errors.New("-controlplane, -certs, -work and -cgroup are required (run hack/attack.sh)")
		}
	}
	if err := writeFile(filepath.Join(*cgroup, "memory.limit_in_bytes"), strconv.FormatInt(*limit<<20, 10)); err != nil {
		return err
	}
	cp, err := startControlPlane()
	if err != nil {
		return err
	}
	defer cp.stop()
	app, err := stuckApp()
	if err != nil {
		return err
	}
	defer app.Close()
	a, err := startAgent(cp, app.Addr().(*net.TCPAddr).Port)
	if err != nil {
		return err
	}
	defer a.stop()
	base, _ := a.peaks()
	fmt.Printf("attack: agent pid %d ready, %d MiB resident; cgroup %s limit %d MiB\n", a.pid, base, *cgroup, *limit)

	attacks := []struct {
		name  string
		bound int64 // MiB over the agent's resident memory at rest
		do    func(*agent) (string, error)
	}{
		{"app probes: 2000 at once, 16 headers of 60 KiB, slow app", 64, probesLargeHeaders},
		{"app probes: 2000 at once, small, slow app", 64, probesMany},
		{"/debug/crashes: 1 GiB sparse record, 16 GETs at once", 32, crashesPage},
		{"/stats/prometheus: 200 scrapes at once", 64, scrapes},
		{"hot restart: a FIFO at envoy's binary path", 32, func(a *agent) (string, error) { return badBinary(a, "fifo") }},
		{"hot restart: /dev/zero's device at envoy's binary path", 32, func(a *agent) (string, error) { return badBinary(a, "device") }},
		{fmt.Sprintf("control plane: one CDS push of %d MiB", *pushMiB), int64(*pushMiB) * 4, push},
		{fmt.Sprintf("control plane: NDS of %d names", *names), 256, nds},
	}
	var rows []row
	for _, at := range attacks {
		a.resetPeaks()
		note, err := at.do(a)
		ag, cg := a.peaks()
		r := row{name: at.name, agentMiB: ag, cgMiB: cg, boundMiB: base + at.bound, note: note}
		if err != nil {
			r.note, r.failed = err.Error(), true
		}
		if alive := a.alive(); alive != nil {
			r.note, r.failed = alive.Error(), true
		}
		if ag > r.boundMiB {
			r.failed = true
		}
		rows = append(rows, r)
		if r.failed && !a.running() {
			break
		}
	}
	rows = append(rows, cliAttacks(*cgroup+"-cli")...)

	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTACK\tAGENT PEAK RSS (MiB)\tCGROUP PEAK (MiB)\tBOUND (MiB)\tRESULT")
	failed := false
	for _, r := range rows {
		res := "ok"
		if r.failed {
			res, failed = "FAIL", true
		}
		if r.note != "" {
			res += ": " + r.note
		}
		cg := strconv.FormatInt(r.cgMiB, 10)
		if r.cgMiB < 0 {
			cg = "-"
		}
		ag := strconv.FormatInt(r.agentMiB, 10)
		if r.agentMiB < 0 {
			ag = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", r.name, ag, cg, r.boundMiB, res)
	}
	tw.Flush()
	if failed {
		log, _ := os.ReadFile(a.stderr)
		fmt.Printf("attack: the end of the agent's log:\n%s\n", log[max(0, len(log)-3000):])
		return errors.New("an attack passed its bound or took the agent down")
	}
	return nil
}

// The agent.

func startAgent(cp *controlPlane, appPort int) (*agent, error) {
	a := &agent{root: filepath.Join(*work, "root"), cp: cp, stderr: filepath.Join(*work, "agent.log")}
	if err := os.MkdirAll(filepath.Join(a.root, "etc"), 0o755); err != nil {
		return nil, err
	}
	if err := exec.Command("cp", "-r", *certs, filepath.Join(a.root, "etc", "certs")).Run(); err != nil {
		return nil, fmt.Errorf("copying the certificates: %w", err)
	}
	a.binary = filepath.Join(*work, "envoy-bin", "envoy")
	if err := os.MkdirAll(filepath.Dir(a.binary), 0o755); err != nil {
		return nil, err
	}
	if err := exec.Command("cp", *envoyBin, a.binary).Run(); err != nil {
		return nil, err
	}
	ports, err := testkit.FreePorts(5)
	if err != nil {
		return nil, err
	}
	a.status, a.admin = ports[0], ports[1]
	log, err := os.Create(a.stderr)
	if err != nil {
		return nil, err
	}
	a.cmd = exec.Command(*agentBin, "proxy", "--root", a.root, "--hot-restart")
	a.cmd.Stdout, a.cmd.Stderr = log, log
	a.cmd.Env = append(os.Environ(),
		fmt.Sprintf(`PROXY_CONFIG={"discoveryAddress":%q,"controlPlaneAuthPolicy":"NONE","statusPort":%d,"proxyAdminPort":%d,"binaryPath":%q}`,
			cp.addr, a.status, a.admin, a.binary),
		fmt.Sprintf("ENVOY_STATUS_PORT=%d", ports[2]), fmt.Sprintf("ENVOY_PROMETHEUS_PORT=%d", ports[3]),
		fmt.Sprintf("DNS_PROXY_ADDR=127.0.0.1:%d", ports[4]), "ISTIO_META_DNS_CAPTURE=true",
		"POD_NAME=attack-0", "POD_NAMESPACE=ns0", "INSTANCE_IP=127.0.0.1", "SERVICE_ACCOUNT=default",
		fmt.Sprintf(`ISTIO_KUBE_APP_PROBERS={"/app-health/app/livez":{"httpGet":{"path":"/slow","port":%d},"timeoutSeconds":10}}`, appPort),
	)
	if err := a.cmd.Start(); err != nil {
		return nil, err
	}
	a.pid = a.cmd.Process.Pid
	// Into the cgroup before it has done anything; Envoy, started later,
	// is its child and lands there too.
	if err := writeFile(filepath.Join(*cgroup, "cgroup.procs"), strconv.Itoa(a.pid)); err != nil {
		a.stop()
		return nil, err
	}
	why := ""
	err = a.await(30*time.Second, 100*time.Millisecond, func() bool {
		code, body := get(a.url("/healthz/ready"), nil)
		why = body
		return code == http.StatusOK
	})
	if err == nil {
		return a, nil
	}
	a.stop()
	tail, _ := os.ReadFile(a.stderr)
	return nil, fmt.Errorf("the agent never turned ready (%s); the end of its log:\n%s", why, tail[max(0, len(tail)-3000):])
}

func (a *agent) url(path string) string { return fmt.Sprintf("http://127.0.0.1:%d%s", a.status, path) }

func (a *agent) running() bool { return syscall.Kill(a.pid, 0) == nil && !testkit.IsZombie(a.pid) }

// The ways an await ends without its condition.
var (
	errDied = errors.New("the agent died")
	errLate = errors.New("not in time")
)

// await asks ok every interval until it holds (nil), the agent is gone
// (errDied), or within has passed (errLate): one wait for every poll of
// the agent's endpoints.
func (a *agent) await(within, every time.Duration, ok func() bool) error {
	for start := time.Now(); time.Since(start) < within; time.Sleep(every) {
		if ok() {
			return nil
		}
		if !a.running() {
			return errDied
		}
	}
	return errLate
}

// alive: the agent still runs and answers readiness.
func (a *agent) alive() error {
	err := a.await(10*time.Second, 100*time.Millisecond, func() bool {
		code, _ := get(a.url("/healthz/ready"), nil)
		return code == http.StatusOK
	})
	if errors.Is(err, errLate) {
		return errors.New("the agent no longer answers /healthz/ready with 200")
	}
	return err
}

func (a *agent) stop() {
	if a.cmd == nil || a.cmd.Process == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { a.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		<-done
	}
}

// resetPeaks clears the agent's peak RSS and the cgroup's peak usage.
func (a *agent) resetPeaks() {
	_ = writeFile(fmt.Sprintf("/proc/%d/clear_refs", a.pid), "5")
	_ = writeFile(filepath.Join(*cgroup, "memory.max_usage_in_bytes"), "0")
}

// peaks are the agent's VmHWM and the cgroup's peak usage, in MiB (-1 when
// unreadable).
func (a *agent) peaks() (agentMiB, cgroupMiB int64) {
	agentMiB, cgroupMiB = -1, -1
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
				kib, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				agentMiB = kib >> 10
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(*cgroup, "memory.max_usage_in_bytes")); err == nil {
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		cgroupMiB = n >> 20
	}
	return agentMiB, cgroupMiB
}

// The attacks.

// stuckApp accepts connections and never answers: the slow application.
func stuckApp() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		var held []net.Conn
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	return ln, nil
}

// flood sends req on n connections at once to addr, reads each answer's
// status line (or the connection's end) and counts them.
func flood(addr string, n int, req []byte) string {
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			status := "connection ended"
			if c, err := net.DialTimeout("tcp", addr, 10*time.Second); err == nil {
				_ = c.SetDeadline(time.Now().Add(40 * time.Second))
				_, _ = c.Write(req)
				if line, err := bufio.NewReader(c).ReadString('\n'); err == nil {
					status = strings.TrimSpace(strings.TrimPrefix(line, "HTTP/1.1 "))
				}
				c.Close()
			} else {
				status = "dial failed"
			}
			mu.Lock()
			counts[status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	var parts []string
	for k, v := range counts {
		parts = append(parts, fmt.Sprintf("%d× %s", v, k))
	}
	return strings.Join(parts, ", ")
}

func probeRequest(headers, size int) []byte {
	var b bytes.Buffer
	b.WriteString("GET /app-health/app/livez HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kube-probe/1.34\r\n")
	v := strings.Repeat("v", size)
	for i := range headers {
		fmt.Fprintf(&b, "X-Attack-%d: %s\r\n", i, v)
	}
	b.WriteString("\r\n")
	return b.Bytes()
}

func probesLargeHeaders(a *agent) (string, error) {
	return flood(fmt.Sprintf("127.0.0.1:%d", a.status), 2000, probeRequest(16, 60<<10)), nil
}

func probesMany(a *agent) (string, error) {
	return flood(fmt.Sprintf("127.0.0.1:%d", a.status), 2000, probeRequest(1, 100)), nil
}

func crashesPage(a *agent) (string, error) {
	dir := filepath.Join(a.root, "etc", "istio", "proxy", "envoy-crashes") // under configPath
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	f, err := os.Create(filepath.Join(dir, "envoy-crash-99991231T000000.000000000Z-epoch0.json"))
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if err := f.Truncate(1 << 30); err != nil {
		return "", err
	}
	f.Close()
	var mu sync.Mutex
	counts := map[int]int{}
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			code, _ := get(a.url("/debug/crashes"), nil)
			mu.Lock()
			counts[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return fmt.Sprintf("answers %v", counts), nil
}

func scrapes(a *agent) (string, error) {
	req := []byte("GET /stats/prometheus HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n")
	return flood(fmt.Sprintf("127.0.0.1:%d", a.status), 200, req), nil
}

// badBinary puts a FIFO or /dev/zero's device at Envoy's binary path, waits
// for the agent to refuse the hot restart, and puts a good binary back.
func badBinary(a *agent, kind string) (string, error) {
	good, err := os.ReadFile(a.binary)
	if err != nil {
		return "", err
	}
	if err := os.Remove(a.binary); err != nil {
		return "", err
	}
	if kind == "fifo" {
		err = syscall.Mkfifo(a.binary, 0o755)
	} else {
		err = syscall.Mknod(a.binary, syscall.S_IFCHR|0o755, 1<<8|5)
	}
	if err != nil {
		return "", err
	}
	defer func() {
		tmp := a.binary + ".new"
		_ = os.WriteFile(tmp, good, 0o755)
		_ = os.Rename(tmp, a.binary)
	}()
	err = a.await(10*time.Second, 100*time.Millisecond, func() bool {
		_, tree := get(a.url("/debug/tree"), nil)
		return strings.Contains(tree, "not a regular file")
	})
	switch {
	case errors.Is(err, errLate):
		return "", errors.New("no refusal on /debug/tree within 10 s")
	case err != nil:
		return "", err
	}
	return "refused, shown in /debug/tree", nil
}

func push(a *agent) (string, error) {
	start := time.Now()
	if err := a.cp.send(fmt.Sprintf("push %d", *pushMiB)); err != nil {
		return "", err
	}
	// The push has reached Envoy when /debug/xds says CDS sent more than
	// the small mesh's few clusters.
	want := *pushMiB << 20 / (4 << 10)
	note, err := awaitClusters(a, func(n int) bool { return n >= want })
	if err != nil {
		return "", err
	}
	note = fmt.Sprintf("%s in %.1fs", note, time.Since(start).Seconds())
	// Back to the small mesh, so that the next attack meets a settled
	// stream (within this attack's peak and allowance).
	if err := a.cp.send("push 0"); err != nil {
		return "", err
	}
	if _, err := awaitClusters(a, func(n int) bool { return n < 100 }); err != nil {
		return "", fmt.Errorf("after the push, back to the small mesh: %w", err)
	}
	return note, nil
}

// awaitClusters waits (1 min at most) until /debug/xds says the number of
// clusters last sent to Envoy is ok.
func awaitClusters(a *agent, ok func(int) bool) (string, error) {
	n := 0
	err := a.await(time.Minute, 200*time.Millisecond, func() bool {
		_, body := get(a.url("/debug/xds"), nil)
		n = sentResources(body, "Cluster")
		return ok(n)
	})
	switch {
	case errors.Is(err, errLate):
		return "", errors.New("not forwarded within 1 min")
	case err != nil:
		return "", err
	}
	return fmt.Sprintf("%d clusters sent to Envoy", n), nil
}

func nds(a *agent) (string, error) {
	start := time.Now()
	if err := a.cp.send(fmt.Sprintf("names %d", *names)); err != nil {
		return "", err
	}
	var body string
	err := a.await(time.Minute, 200*time.Millisecond, func() bool {
		_, body = get(a.url("/debug/names"), nil)
		return strings.Contains(body, fmt.Sprintf(`"names": %d`, *names))
	})
	switch {
	case errors.Is(err, errLate):
		return "", fmt.Errorf("table not taken within 1 min: /debug/names says %s", strings.Join(strings.Fields(body), " "))
	case err != nil:
		return "", err
	}
	return fmt.Sprintf("table of %d names taken in %.1fs", *names, time.Since(start).Seconds()), nil
}

// sentResources reads the sent_resources of the type whose URL ends with
// suffix from /debug/xds.
func sentResources(body, suffix string) int {
	i := strings.Index(body, suffix+`"`)
	if i < 0 {
		return 0
	}
	j := strings.Index(body[i:], `"sent_resources":`)
	if j < 0 {
		return 0
	}
	rest := strings.TrimLeft(body[i+j+len(`"sent_resources":`):], " ")
	end := strings.IndexAny(rest, ",\n}")
	if end < 0 {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(rest[:end]))
	return n
}

// cliAttacks run the CLI against hostile servers on the ports it calls
// (free in this namespace: the agent's are elsewhere): an endless body, a
// 10 MiB error body. The peak is the command's own: it runs alone in the
// memory cgroup cg (made here, and removed), which it joins before it
// execs (a child's rusage would start from the attacker's own peak, which
// exec inherits from the vfork).
func cliAttacks(cg string) []row {
	if err := os.Mkdir(cg, 0o755); err != nil {
		return []row{{name: "CLI attacks", note: err.Error(), failed: true}}
	}
	defer os.Remove(cg)
	zeros := bytes.Repeat([]byte("0"), 64<<10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" || r.URL.Path == "/healthz/ready" {
			w.WriteHeader(http.StatusInternalServerError)
			for range 160 {
				if _, err := w.Write(zeros); err != nil {
					return
				}
			}
			return
		}
		for {
			if _, err := w.Write(zeros); err != nil {
				return
			}
		}
	})
	var servers []*http.Server
	for _, port := range []int{15000, 15020, 15021} {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return []row{{name: "CLI attacks", note: err.Error(), failed: true}}
		}
		srv := &http.Server{Handler: h}
		go srv.Serve(ln)
		servers = append(servers, srv)
	}
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	var rows []row
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"CLI: request GET /stats, endless body", []string{"request", "GET", "/stats"}, "answer cut at"},
		{"CLI: request POST /fail, 10 MiB 500", []string{"request", "POST", "/fail"}, "answer cut at its first"},
		{"CLI: proxy-config clusters, endless body", []string{"proxy-config", "clusters"}, "answer cut at 64 MiB"},
		{"CLI: proxy-status, endless body", []string{"proxy-status"}, "answer cut at 4 MiB"},
		{"CLI: wait, 10 MiB 500", []string{"wait", "--timeoutSeconds", "1"}, "answer cut at its first"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		_ = writeFile(filepath.Join(cg, "memory.max_usage_in_bytes"), "0")
		cmd := exec.CommandContext(ctx, "sh", append([]string{"-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, cg, *agentBin}, c.args...)...)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = io.Discard, &stderr
		err := cmd.Run()
		cancel()
		r := row{name: c.name, agentMiB: -1, boundMiB: 100}
		if b, rerr := os.ReadFile(filepath.Join(cg, "memory.max_usage_in_bytes")); rerr == nil {
			n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			r.cgMiB = n >> 20
		}
		msg := strings.TrimSpace(stderr.String())
		switch {
		case err == nil:
			r.note, r.failed = "succeeded against a hostile server", true
		case !strings.Contains(msg, c.want):
			r.note, r.failed = fmt.Sprintf("error does not say %q: %.200s", c.want, msg), true
		case stderr.Len() > 8<<10:
			r.note, r.failed = fmt.Sprintf("%d bytes of error", stderr.Len()), true
		default:
			r.note = "says " + c.want
		}
		if r.cgMiB > r.boundMiB {
			r.failed = true
		}
		rows = append(rows, r)
	}
	return rows
}

// The control plane.

type controlPlane struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	addr string
}

func startControlPlane() (*controlPlane, error) {
	cp := &controlPlane{cmd: exec.Command(*cpBin, "-namespace", "ns0", "-names", "10")} // a table: the DNS proxy waits for one
	var err error
	if cp.in, err = cp.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cp.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cp.cmd.Stderr = os.Stderr
	if err := cp.cmd.Start(); err != nil {
		return nil, err
	}
	cp.out = bufio.NewReader(out)
	line, err := cp.out.ReadString('\n')
	if err != nil {
		cp.stop()
		return nil, fmt.Errorf("the control plane: %w", err)
	}
	cp.addr = strings.TrimSpace(line)
	return cp, nil
}

// send gives the control plane a command and waits for its "pushed".
func (cp *controlPlane) send(line string) error {
	if _, err := fmt.Fprintln(cp.in, line); err != nil {
		return err
	}
	got, err := cp.out.ReadString('\n')
	if err != nil || strings.TrimSpace(got) != "pushed" {
		return fmt.Errorf("the control plane answered %q to %q: %v", got, line, err)
	}
	return nil
}

func (cp *controlPlane) stop() {
	cp.in.Close()
	_ = cp.cmd.Process.Signal(syscall.SIGTERM)
	_ = cp.cmd.Wait()
}

// Helpers.

var client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// get is a GET's status and the start of its body (at most 1 MiB).
func get(url string, _ http.Header) (int, string) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

func writeFile(path, s string) error {
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		return fmt.Errorf("writing %q to %s: %w", s, path, err)
	}
	return nil
}
