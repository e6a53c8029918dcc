// Command xdsbench is the whole-process xDS proxy benchmark (make
// bench-xds, through bench/xds/run.sh). In one run it measures the same
// pushes three ways: a client connected to the control plane directly, the
// same through meshagent's proxy (xdsproxyd), and through Istio's
// pilot-agent; it prints each figure beside its baseline, as a ratio:
//
//   - a CDS push of 1,000 and 10,000 clusters, State of the World and
//     Delta: time from the snapshot until the client holds every cluster
//     (median of -rounds, rounds interleaved, the order rotated);
//   - small updates (one cluster): the latency each proxy adds, p50/p99;
//   - each proxy's peak RSS (VmHWM) after the runs of a size, a fresh pair
//     of processes per size; and, sampled across the pushes, its peak anon
//     memory (RssAnon) and, with -cgroups, the peak working set of a memory
//     cgroup of its own (mem.go); with -settle D, also its anon and working
//     set D after the last push, the clients still connected: what a
//     proxy keeps of a mesh's configuration once it is pushed (#36).
//
// -agent NAME=BIN[,ENV=VALUE|-FLAG...] (repeatable) adds a whole agent run
// as users run it (`BIN proxy sidecar -FLAG...`, "{dir}" in a flag being
// the agent's working directory; DISABLE_ENVOY=true, plaintext to the
// control plane, file-mounted certs copied from -istio-dir): make
// bench-vs-istio measures the shipped meshagent beside Istio's agent this
// way, with GC settings as ENV (#24). -tsv FILE writes every figure as
// "figure<TAB>target<TAB>median<TAB>p25<TAB>p75" rows for its table
// (milliseconds; MiB for peak-rss).
//
// The control plane (go-control-plane, testdata/testkit/xdsserver) and the
// clients (which decode every resource, as Envoy does) run in this
// process; each client has a snapshot of its own, so a push reaches one
// client at a time.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

func main() {
	meshagent := flag.String("meshagent", "", "the xdsproxyd binary")
	istio := flag.String("istio", "", "Istio's pilot-agent binary (empty: not measured)")
	istioDir := flag.String("istio-dir", "", "pilot-agent's working directory, with file-mounted certs in etc/certs")
	rounds := flag.Int("rounds", 15, "pushes per figure (medians)")
	small := flag.Int("small", 200, "small updates per protocol")
	sizesFlag := flag.String("sizes", "1000,10000", "cluster counts")
	noCache := flag.Bool("nocache", false, "also measure meshagent without its last-known-good cache (what the cache costs)")
	var agents agentFlags
	flag.Var(&agents, "agent", "NAME=BIN[,ENV=VALUE...]: a whole agent run with `proxy sidecar` (repeatable)")
	tsv := flag.String("tsv", "", "write every figure to this file as tab-separated rows")
	settle := flag.Duration("settle", 0, "after a size's pushes, wait this long and sample each proxy's memory once more (0: not)")
	cgroups := flag.String("cgroups", "", "a cgroup v1 memory hierarchy (/sys/fs/cgroup/memory): run each proxy in a cgroup of its own there and report its working set")
	flag.Parse()
	if *meshagent == "" && len(agents) == 0 {
		fail(errors.New("-meshagent or -agent is required"))
	}
	var sizes []int
	for _, s := range strings.Split(*sizesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			fail(fmt.Errorf("-sizes: %w", err))
		}
		sizes = append(sizes, n)
	}
	b := &bench{meshagent: *meshagent, istio: *istio, istioDir: *istioDir, rounds: *rounds, small: *small, noCache: *noCache, agents: agents, cgroups: *cgroups, settle: *settle}
	if err := b.run(sizes); err != nil {
		fail(err)
	}
	if *tsv != "" {
		if err := os.WriteFile(*tsv, []byte(strings.Join(b.rows, "")), 0o644); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "xdsbench:", err)
	os.Exit(1)
}

type bench struct {
	meshagent, istio, istioDir string
	rounds, small              int
	noCache                    bool
	agents                     agentFlags
	cgroups                    string // -cgroups
	settle                     time.Duration
	cp                         *xdsserver.Server
	lines                      []string
	rows                       []string // -tsv
}

// agentSpec is one -agent flag.
type agentSpec struct {
	name, bin string
	env, args []string
}

type agentFlags []agentSpec

func (a *agentFlags) String() string { return fmt.Sprint(*a) }

func (a *agentFlags) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	if !ok || name == "" || rest == "" {
		return errors.New("want NAME=BIN[,ENV=VALUE...]")
	}
	parts := strings.Split(rest, ",")
	spec := agentSpec{name: name, bin: parts[0]}
	for _, p := range parts[1:] {
		if strings.HasPrefix(p, "-") {
			spec.args = append(spec.args, p)
		} else {
			spec.env = append(spec.env, p)
		}
	}
	*a = append(*a, spec)
	return nil
}

// row records one figure for -tsv: the median and quartiles of ds.
func (b *bench) row(figure, target string, ds []time.Duration) {
	b.rows = append(b.rows, fmt.Sprintf("%s\t%s\t%.3f\t%.3f\t%.3f\n", figure, target,
		ms(xdsserver.Quantile(ds, 0.5)), ms(xdsserver.Quantile(ds, 0.25)), ms(xdsserver.Quantile(ds, 0.75))))
}

// target is one way to the control plane.
type target struct {
	name   string
	node   string // the client's node ID: each target has a snapshot of its own
	addr   string // what the client dials
	proc   *exec.Cmd
	dir    string // removed when stopped
	client *xdsserver.Client
	// With -cgroups: the proxy's memory cgroup, and the directory of the
	// copy of its binary it runs (both removed when stopped).
	cgroup, binDir string
}

func (b *bench) run(sizes []int) error {
	cp, err := xdsserver.Start(xdsserver.Options{ByNode: true})
	if err != nil {
		return err
	}
	defer cp.Close()
	b.cp = cp
	for i, n := range sizes {
		targets, err := b.startProxies(n)
		if err != nil {
			return err
		}
		before := startSampler(targets).stop()
		smp := startSampler(targets)
		err = b.measureSize(targets, n, i == 0)
		b.rss(targets, n, before, smp.stop())
		if err == nil && b.settle > 0 {
			time.Sleep(b.settle)
			b.settled(targets, n, startSampler(targets).stop())
		}
		stopAll(targets)
		if err != nil {
			return err
		}
	}
	fmt.Println()
	fmt.Println("== xDS proxy: meshagent and Istio's pilot-agent against a direct connection (same run) ==")
	for _, l := range b.lines {
		fmt.Println(l)
	}
	return nil
}

func (b *bench) startProxies(n int) ([]*target, error) {
	targets := []*target{{name: "direct", node: "direct", addr: b.cp.Addr()}}
	for _, a := range b.agents {
		t, err := b.startAgent(a)
		if err != nil {
			stopAll(targets)
			return nil, err
		}
		targets = append(targets, t)
	}
	if b.meshagent != "" {
		t, err := b.startMeshagent("meshagent", true)
		if err != nil {
			stopAll(targets)
			return nil, err
		}
		targets = append(targets, t)
	}
	if b.meshagent != "" && b.noCache {
		t, err := b.startMeshagent("meshagent-nocache", false)
		if err != nil {
			stopAll(targets)
			return nil, err
		}
		targets = append(targets, t)
	}

	if b.istio != "" {
		t, err := b.startIstio()
		if err != nil {
			stopAll(targets)
			return nil, err
		}
		targets = append(targets, t)
	}
	fmt.Fprintf(os.Stderr, "xdsbench: %d clusters: proxies started\n", n)
	return targets, nil
}

// startMeshagent runs xdsproxyd; name is also the node it caches for.
func (b *bench) startMeshagent(name string, cache bool) (*target, error) {
	dir, err := os.MkdirTemp("", "xdsb")
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "XDS")
	t := &target{name: name, node: name, addr: "unix://" + sock, dir: dir}
	cmd, err := b.command(t, b.meshagent, "-socket", sock, "-upstream", b.cp.Addr(), "-node", name,
		"-cache-file", filepath.Join(dir, "xds-cache.pb"), fmt.Sprintf("-offline-cache=%t", cache))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening") {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("xdsproxyd did not start: %q %v", line, err)
	}
	t.proc = cmd
	return t, nil
}

// command is the command that runs bin for t: as it is, or with -cgroups
// a fresh copy of it in a memory cgroup of its own (mem.go).
func (b *bench) command(t *target, bin string, args ...string) (*exec.Cmd, error) {
	argv := append([]string{bin}, args...)
	if b.cgroups != "" {
		dir, err := os.MkdirTemp("", "xdsb-bin")
		if err != nil {
			return nil, err
		}
		t.binDir = dir
		if t.cgroup, argv[0], err = newCgroup(b.cgroups, t.name, bin, dir); err != nil {
			return nil, err
		}
		argv = inCgroup(t.cgroup, argv)
	}
	return exec.Command(argv[0], argv[1:]...), nil
}

// startIstio runs pilot-agent without Envoy (DISABLE_ENVOY), plaintext to
// the control plane, file-mounted certs, no cloud probes, and no DNS
// capture (so its DNS proxy never forwards to this machine's resolver),
// with status and admin ports of its own.
func (b *bench) startIstio() (*target, error) {
	return b.startWholeAgent("istio", b.istio, b.istioDir, nil, nil, "")
}

// startAgent runs an -agent in a directory of its own, with the certs of
// -istio-dir.
func (b *bench) startAgent(a agentSpec) (*target, error) {
	dir, err := os.MkdirTemp("", "xdsb")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		return nil, err
	}
	if err := os.CopyFS(filepath.Join(dir, "etc/certs"), os.DirFS(filepath.Join(b.istioDir, "etc/certs"))); err != nil {
		return nil, err
	}
	var args []string
	for _, f := range a.args {
		args = append(args, strings.ReplaceAll(f, "{dir}", dir))
	}
	return b.startWholeAgent(a.name, a.bin, dir, a.env, args, dir)
}

// startWholeAgent runs `bin proxy sidecar` in dir; rm is removed when it
// stops (empty: nothing).
func (b *bench) startWholeAgent(name, bin, dir string, env, args []string, rm string) (*target, error) {
	ports, err := testkit.FreePorts(2)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "etc/istio/proxy/XDS")
	_ = os.Remove(sock)
	// The client is the agent's Envoy: it has the agent's node ID, so that
	// the agent records its last-known-good configuration (and writes its
	// cache file) as in production, where it caches only its own Envoy's
	// (#24: with another node the agent measured skipped both). POD_NAME
	// makes the node ID, and so the snapshot, each agent's own.
	node := fmt.Sprintf("sidecar~127.0.0.1~%s.default~default.svc.cluster.local", name)
	t := &target{name: name, node: node, addr: "unix://" + sock, dir: rm}
	cmd, err := b.command(t, bin, append([]string{"proxy", "sidecar"}, args...)...)
	if err != nil {
		return nil, err
	}
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		fmt.Sprintf(`PROXY_CONFIG={"discoveryAddress":%q,"controlPlaneAuthPolicy":"NONE","statusPort":%d,"proxyAdminPort":%d}`, b.cp.Addr(), ports[0], ports[1]),
		"DISABLE_ENVOY=true", "FILE_MOUNTED_CERTS=true", "CLOUD_PLATFORM=none",
		"POD_NAME="+name, "POD_NAMESPACE=default", "INSTANCE_IP=127.0.0.1",
		"ISTIO_META_DNS_CAPTURE=false", "ISTIO_META_DNS_AUTO_ALLOCATE=false")
	cmd.Env = append(cmd.Env, env...)
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// pilot-agent says nothing a script can wait on: try its socket,
	// bounded (10s).
	for i := 0; ; i++ {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			break
		}
		if i == 200 {
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("%s's XDS socket %s never accepted (see %s/%s.log)", name, sock, dir, name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.proc = cmd
	return t, nil
}

func stopAll(targets []*target) {
	for _, t := range targets {
		if t.client != nil {
			t.client.Close()
			t.client = nil
		}
		if t.proc != nil {
			_ = t.proc.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = t.proc.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = t.proc.Process.Kill()
				<-done
			}
		}
		if t.cgroup != "" {
			removeCgroup(t.cgroup)
		}
		for _, d := range []string{t.dir, t.binDir} {
			if d != "" {
				_ = os.RemoveAll(d)
			}
		}
	}
}

func (b *bench) connect(targets []*target, delta bool) error {
	for _, t := range targets {
		if t.client != nil {
			t.client.Close()
		}
		// One node per target (its own snapshot). A meshagent's is the node
		// it caches for (target.node), so that its last-known-good cache
		// works as in production while it is measured.
		c, err := xdsserver.NewClient(xdsserver.ClientOptions{
			Target: t.addr, Delta: delta, Node: &corev3.Node{Id: t.node},
			Types: []string{resource.ClusterType}, Reconnect: true,
		})
		if err != nil {
			return err
		}
		t.client = c
	}
	return nil
}

func (b *bench) measureSize(targets []*target, n int, withSmall bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	for _, delta := range []bool{false, true} {
		proto := map[bool]string{false: "sotw", true: "delta"}[delta]
		if err := b.connect(targets, delta); err != nil {
			return err
		}
		for _, t := range targets {
			if _, err := xdsserver.Push(ctx, b.cp, t.client, t.node, "warm", xdsserver.RoundClusters(n, 0)); err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
		}
		times := map[string][]time.Duration{}
		for r := 1; r <= b.rounds; r++ {
			clusters := xdsserver.RoundClusters(n, r)
			for i := range targets {
				t := targets[(i+r)%len(targets)]
				d, err := xdsserver.Push(ctx, b.cp, t.client, t.node, fmt.Sprintf("r%d", r), clusters)
				if err != nil {
					return fmt.Errorf("%s: %w", t.name, err)
				}
				times[t.name] = append(times[t.name], d)
			}
		}
		base := xdsserver.Quantile(times["direct"], 0.5)
		line := fmt.Sprintf("cds-push %-5s %5d clusters: direct %8.2f ms", proto, n, ms(base))
		for _, t := range targets[1:] {
			m := xdsserver.Quantile(times[t.name], 0.5)
			line += fmt.Sprintf(" | %s %8.2f ms (%.2f×)", t.name, ms(m), float64(m)/float64(base))
		}
		b.lines = append(b.lines, line+fmt.Sprintf("  [median of %d]", b.rounds))
		for _, t := range targets {
			b.row(fmt.Sprintf("push-%s-%d", proto, n), t.name, times[t.name])
		}
		fmt.Fprintln(os.Stderr, "xdsbench:", line)

		if withSmall {
			if err := b.measureSmall(ctx, targets, delta, proto); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *bench) measureSmall(ctx context.Context, targets []*target, delta bool, proto string) error {
	if err := b.connect(targets, delta); err != nil {
		return err
	}
	times := map[string][]time.Duration{}
	for r := 0; r <= b.small; r++ {
		clusters := xdsserver.RoundClusters(1, r)
		for i := range targets {
			t := targets[(i+r)%len(targets)]
			d, err := xdsserver.Push(ctx, b.cp, t.client, t.node, fmt.Sprintf("s%d", r), clusters)
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			if r > 0 { // round 0 is the first fetch
				times[t.name] = append(times[t.name], d)
			}
		}
	}
	p50, p99 := xdsserver.Quantile(times["direct"], 0.5), xdsserver.Quantile(times["direct"], 0.99)
	line := fmt.Sprintf("small-update %-5s: direct p50 %.3f ms p99 %.3f ms", proto, ms(p50), ms(p99))
	for _, t := range targets[1:] {
		q50, q99 := xdsserver.Quantile(times[t.name], 0.5), xdsserver.Quantile(times[t.name], 0.99)
		line += fmt.Sprintf(" | %s added p50 %+.3f ms p99 %+.3f ms", t.name, ms(q50-p50), ms(q99-p99))
	}
	b.lines = append(b.lines, line+fmt.Sprintf("  [%d updates]", b.small))
	for _, t := range targets {
		b.row("small-"+proto, t.name, times[t.name])
	}
	fmt.Fprintln(os.Stderr, "xdsbench:", line)
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
