package kube

// What the suite reads on the node itself, beside the API server: the
// kubelet's log, the pods' cgroups and processes, the NAT counters in a
// pod's network namespace, the events the app wrote to a hostPath.

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/image"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// redirected sums the packet counters of a NAT chain in a pod's network
// namespace, read with whichever iptables backend holds the pod's rules.
func (s *suite) redirected(t *testing.T, pod, chain string) (int, error) {
	pid, err := s.containerPID(t, pod, "app")
	if err != nil {
		return 0, err
	}
	for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
		out, err := execOut("nsenter", "-t", strconv.Itoa(pid), "-n", save, "-c", "-t", "nat")
		if err != nil || !strings.Contains(out, ":"+chain+" ") {
			continue
		}
		sum := 0
		re := regexp.MustCompile(`^\[(\d+):\d+\] -A ` + chain + ` `)
		for _, l := range strings.Split(out, "\n") {
			if m := re.FindStringSubmatch(l); m != nil {
				n, _ := strconv.Atoi(m[1])
				sum += n
			}
		}
		return sum, nil
	}
	return 0, fmt.Errorf("no %s chain in pod %s's network namespace", chain, pod)
}

// appEvents reads the termination events the app wrote to the hostPath:
// when each happened (the last time), and how often.
func (s *suite) appEvents(pod string) (map[string]time.Time, map[string]int, error) {
	data, err := os.ReadFile(filepath.Join(s.n.root, eventsDir, pod+".log"))
	if err != nil {
		return nil, nil, err
	}
	at, n := map[string]time.Time{}, map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue
		}
		if when, err := time.Parse(time.RFC3339Nano, f[0]); err == nil {
			at[f[2]] = when
			n[f[2]]++
		}
	}
	return at, n, nil
}

// kubeletLines returns the kubelet log lines about a pod holding what.
func (s *suite) kubeletLines(pod, what string) []string {
	f, err := os.Open(filepath.Join(s.n.root, "logs", "kubelet.log"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.Contains(l, what) && strings.Contains(l, `pod="`+testNS+"/"+pod+`"`) {
			out = append(out, l)
		}
	}
	return out
}

var containerName = regexp.MustCompile(`containerName="([^"]+)"`)

// kubeletKills is when the kubelet started killing each container of the
// pod (its preStop hook runs first), from its klog timestamps.
func (s *suite) kubeletKills(t *testing.T, pod string) map[string]time.Time {
	kills := map[string]time.Time{}
	for _, l := range s.kubeletLines(pod, "Killing container with a grace period") {
		m := containerName.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		if at, ok := klogTime(l); ok {
			kills[m[1]] = at
		} else {
			t.Logf("no klog time in %q", l)
		}
	}
	return kills
}

// containerDied is when the kubelet saw a container of the pod exit (its
// PLEG relists every second), from its log.
func (s *suite) containerDied(pod, containerID string) (time.Time, bool) {
	id := strings.TrimPrefix(containerID, "containerd://")
	for _, l := range s.kubeletLines(pod, `"Type":"ContainerDied","Data":"`+id+`"`) {
		if at, ok := klogTime(l); ok {
			return at, true
		}
	}
	return time.Time{}, false
}

// klogTime is a kubelet log line's timestamp (klog: "I1126 13:25:26.175900",
// local time, no year).
func klogTime(l string) (time.Time, bool) {
	if len(l) < 21 {
		return time.Time{}, false
	}
	at, err := time.ParseInLocation("0102 15:04:05.000000", l[1:21], time.Local)
	if err != nil {
		return time.Time{}, false
	}
	return at.AddDate(time.Now().Year(), 0, 0), true
}

// containerCgroup is a container's cgroup v1 directory under controller.
func (s *suite) containerCgroup(t *testing.T, pod, container, controller string) (string, error) {
	p := s.n.getPod(t, pod)
	st, ok := p.status(container)
	if !ok || st.ContainerID == "" {
		return "", fmt.Errorf("%s/%s has no container ID yet", pod, container)
	}
	id := strings.TrimPrefix(st.ContainerID, "containerd://")
	uid := strings.ReplaceAll(p.Metadata.UID, "-", "_")
	for _, pattern := range []string{"*/pod%s/%s", "pod%s/%s"} {
		m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", controller, "kubenode", "kubepods", fmt.Sprintf(pattern, p.Metadata.UID, id)))
		if len(m) == 0 {
			m, _ = filepath.Glob(filepath.Join("/sys/fs/cgroup", controller, "kubenode", "kubepods", fmt.Sprintf(pattern, uid, id)))
		}
		if len(m) > 0 {
			return m[0], nil
		}
	}
	return "", fmt.Errorf("no %s cgroup for %s/%s (%s)", controller, pod, container, id)
}

func (s *suite) containerPIDs(t *testing.T, pod, container string) ([]int, error) {
	dir, err := s.containerCgroup(t, pod, container, "memory")
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// containerProc is a process of a container as the node sees it.
type containerProc struct {
	pid, ppid int
	comm      string
	argv      []string
}

// containerProcs are a container's processes: pid, parent, name, argv.
func (s *suite) containerProcs(t *testing.T, pod, container string) ([]containerProc, error) {
	pids, err := s.containerPIDs(t, pod, container)
	if err != nil {
		return nil, err
	}
	var procs []containerProc
	for _, pid := range pids {
		comm, fields, err := testkit.ProcStat(pid)
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone meanwhile
		}
		if err != nil || len(fields) < 2 {
			return nil, fmt.Errorf("process %d: %v %q", pid, err, fields)
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		ppid, _ := strconv.Atoi(fields[1]) // state, then ppid
		procs = append(procs, containerProc{pid: pid, ppid: ppid, comm: comm,
			argv: strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")})
	}
	return procs, nil
}

// processTree checks the istio-proxy container's processes as our image's
// entrypoint makes them (#36): its first process is meshagent-init, started
// by the runtime with the agent's path and name and the injector's args
// (proxy sidecar ...), not by the agent replacing itself with it; the agent
// is its one child, started once, as pilot-agent; Envoy is the agent's.
func (s *suite) processTree(t *testing.T, pod string) error {
	procs, err := s.containerProcs(t, pod, "istio-proxy")
	if err != nil {
		return err
	}
	byName := map[string][]containerProc{}
	for _, p := range procs {
		byName[p.comm] = append(byName[p.comm], p)
	}
	describe := fmt.Sprintf("%+v", procs)
	if len(byName[image.InitName]) != 1 || len(byName["pilot-agent"]) != 1 || len(byName["envoy"]) != 1 {
		return fmt.Errorf("want one %s, one pilot-agent and one envoy in istio-proxy: %s", image.InitName, describe)
	}
	init, agent, envoy := byName[image.InitName][0], byName["pilot-agent"][0], byName["envoy"][0]
	want := append(slices.Clone(image.AgentEntrypoint), "proxy", "sidecar")
	if len(init.argv) < len(want) || !slices.Equal(init.argv[:len(want)], want) {
		return fmt.Errorf("%s's argv %q, want the image's entrypoint and the injector's args %q...", image.InitName, init.argv, want)
	}
	if agent.ppid != init.pid || envoy.ppid != agent.pid {
		return fmt.Errorf("want %s → pilot-agent → envoy: %s", image.InitName, describe)
	}
	if !slices.Equal(agent.argv, init.argv[2:]) {
		return fmt.Errorf("the agent's argv %q, want %q (its name, the container's args)", agent.argv, init.argv[2:])
	}
	t.Logf("istio-proxy's processes: %s %d → pilot-agent %d → envoy %d", image.InitName, init.pid, agent.pid, envoy.pid)
	return nil
}

func (s *suite) containerPID(t *testing.T, pod, container string) (int, error) {
	pids, err := s.containerPIDs(t, pod, container)
	if err != nil {
		return 0, err
	}
	if len(pids) == 0 {
		return 0, fmt.Errorf("no process in %s/%s", pod, container)
	}
	return pids[0], nil
}

func (s *suite) envoyPID(t *testing.T, pod string) (int, error) {
	pids, err := s.containerPIDs(t, pod, "istio-proxy")
	if err != nil {
		return 0, err
	}
	for _, p := range pids {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); strings.TrimSpace(string(comm)) == "envoy" {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no envoy process in %s's istio-proxy (pids %v)", pod, pids)
}

// workingSet is a container's memory as the kubelet reports it on cgroup
// v1: memory.usage_in_bytes minus total_inactive_file. stat is the cgroup's
// memory.stat, for saying what the working set is made of (issue 24: the
// gap between the two agents' containers is not in their RSS).
func (s *suite) workingSet(t *testing.T, pod, container string) (ws int64, stat map[string]int64, err error) {
	dir, err := s.containerCgroup(t, pod, container, "memory")
	if err != nil {
		return 0, nil, err
	}
	usage, err := os.ReadFile(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		return 0, nil, err
	}
	u, err := strconv.ParseInt(strings.TrimSpace(string(usage)), 10, 64)
	if err != nil {
		return 0, nil, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return 0, nil, err
	}
	stat = map[string]int64{}
	for _, l := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			stat[k], _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return max(u-stat["total_inactive_file"], 0), stat, nil
}

// logProxyDir logs the files in istio-proxy's /etc/istio/proxy, the
// injector's Memory-medium emptyDir: what is there is charged to the
// container as shmem.
func (s *suite) logProxyDir(t *testing.T, pod string) {
	pid, err := s.containerPID(t, pod, "istio-proxy")
	if err != nil {
		t.Logf("%s: /etc/istio/proxy: %v", pod, err)
		return
	}
	dir := fmt.Sprintf("/proc/%d/root/etc/istio/proxy", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Logf("%s: /etc/istio/proxy: %v", pod, err)
		return
	}
	var files []string
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			files = append(files, fmt.Sprintf("%s %d", e.Name(), info.Size()))
		}
	}
	t.Logf("%s: /etc/istio/proxy holds %s", pod, strings.Join(files, ", "))
}

// processRSS is the VmRSS and RssAnon (its own heap and stacks, without
// the mapped binary and libraries) of the process named comm in a
// container.
func (s *suite) processRSS(t *testing.T, pod, container, comm string) (rss, anon int64, err error) {
	pids, err := s.containerPIDs(t, pod, container)
	if err != nil {
		return 0, 0, err
	}
	for _, p := range pids {
		if c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); strings.TrimSpace(string(c)) != comm {
			continue
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p))
		if err != nil {
			return 0, 0, err
		}
		kb := func(field string) int64 {
			for _, l := range strings.Split(string(status), "\n") {
				if v, ok := strings.CutPrefix(l, field+":"); ok {
					n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
					return n << 10
				}
			}
			return 0
		}
		return kb("VmRSS"), kb("RssAnon"), nil
	}
	return 0, 0, fmt.Errorf("no %s process in %s/%s (pids %v)", comm, pod, container, pids)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
