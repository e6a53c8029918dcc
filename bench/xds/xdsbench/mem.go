package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Memory as Kubernetes counts it (#24), beside VmHWM: while a size's pushes
// run, every sampleEvery each proxy's anon memory (RssAnon: its heap and
// stacks, what it allocated and did not give back) and, with -cgroups, its
// memory cgroup's working set (usage − total_inactive_file, what the
// kubelet reports and evicts on: anon plus the active file pages). The
// peaks are the figures. VmHWM also counts the executable's file pages,
// which both agents hold alike and which a push does not move.

const sampleEvery = 5 * time.Millisecond

// rss records each proxy's peak RSS for this size, and its peak anon and
// working set across the pushes with what they were before them.
func (b *bench) rss(targets []*target, n int, before, peaks map[string]memPeak) {
	vals := map[string]float64{}
	line := fmt.Sprintf("peak-rss %5d clusters:", n)
	for _, t := range targets {
		if t.proc == nil {
			continue
		}
		kib, err := statusKiB(t.proc.Process.Pid, "VmHWM:")
		if err != nil {
			line += fmt.Sprintf(" %s ?(%v)", t.name, err)
			continue
		}
		v := kib / 1024
		vals[t.name] = v
		p, p0 := peaks[t.name], before[t.name]
		line += fmt.Sprintf(" %s %.1f MiB (anon %.1f, before %.1f", t.name, v, p.anon, p0.anon)
		b.value(fmt.Sprintf("peak-rss-%d", n), t.name, v)
		b.value(fmt.Sprintf("peak-anon-%d", n), t.name, p.anon)
		b.value(fmt.Sprintf("idle-anon-%d", n), t.name, p0.anon)
		if t.cgroup != "" {
			line += fmt.Sprintf("; working set %.1f, before %.1f", p.ws, p0.ws)
			b.value(fmt.Sprintf("peak-ws-%d", n), t.name, p.ws)
			b.value(fmt.Sprintf("idle-ws-%d", n), t.name, p0.ws)
		}
		line += ")"
	}
	if vals["istio"] > 0 && vals["meshagent"] > 0 {
		line += fmt.Sprintf(" (meshagent/istio %.2f×)", vals["meshagent"]/vals["istio"])
	}
	b.lines = append(b.lines, line)
	fmt.Fprintln(os.Stderr, "xdsbench:", line)
}

// settled records each proxy's anon and working set -settle after the
// last push of this size.
func (b *bench) settled(targets []*target, n int, now map[string]memPeak) {
	line := fmt.Sprintf("settled %5d clusters, %v after the pushes:", n, b.settle)
	for _, t := range targets {
		if t.proc == nil {
			continue
		}
		m := now[t.name]
		line += fmt.Sprintf(" %s anon %.1f", t.name, m.anon)
		b.value(fmt.Sprintf("settled-anon-%d", n), t.name, m.anon)
		if t.cgroup != "" {
			line += fmt.Sprintf(", working set %.1f", m.ws)
			b.value(fmt.Sprintf("settled-ws-%d", n), t.name, m.ws)
		}
		line += ";"
	}
	b.lines = append(b.lines, line)
	fmt.Fprintln(os.Stderr, "xdsbench:", line)
}

// value records one figure of one value (MiB) for -tsv.
func (b *bench) value(figure, target string, v float64) {
	b.rows = append(b.rows, fmt.Sprintf("%s\t%s\t%.1f\t%.1f\t%.1f\n", figure, target, v, v, v))
}

// memPeak is one proxy's peaks across a size's runs, in MiB.
type memPeak struct {
	anon, ws float64
}

// sampler samples the proxies of one size until stop.
type sampler struct {
	targets []*target
	done    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	peaks   map[string]*memPeak
}

func startSampler(targets []*target) *sampler {
	s := &sampler{targets: targets, done: make(chan struct{}), peaks: map[string]*memPeak{}}
	for _, t := range targets {
		if t.proc != nil {
			s.peaks[t.name] = &memPeak{}
		}
	}
	s.wg.Add(1)
	go s.run()
	return s
}

func (s *sampler) run() {
	defer s.wg.Done()
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	for {
		for _, t := range s.targets {
			if t.proc == nil {
				continue
			}
			anon, errA := statusKiB(t.proc.Process.Pid, "RssAnon:")
			ws, errW := workingSet(t.cgroup)
			s.mu.Lock()
			p := s.peaks[t.name]
			if errA == nil {
				p.anon = max(p.anon, anon/1024)
			}
			if errW == nil && t.cgroup != "" {
				p.ws = max(p.ws, ws/1048576)
			}
			s.mu.Unlock()
		}
		select {
		case <-tick.C:
		case <-s.done:
			return
		}
	}
}

// stop ends the sampling and returns the peaks by target.
func (s *sampler) stop() map[string]memPeak {
	close(s.done)
	s.wg.Wait()
	out := map[string]memPeak{}
	for k, v := range s.peaks {
		out[k] = *v
	}
	return out
}

// statusKiB reads one "Key: N kB" line of /proc/PID/status.
func statusKiB(pid int, key string) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return fieldValue(b, key)
}

// workingSet is the kubelet's working set of cgroup v1 directory dir, in
// bytes: memory.usage_in_bytes − total_inactive_file.
func workingSet(dir string) (float64, error) {
	if dir == "" {
		return 0, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		return 0, err
	}
	usage, err := strconv.ParseFloat(string(bytes.TrimSpace(b)), 64)
	if err != nil {
		return 0, err
	}
	b, err = os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return 0, err
	}
	inactive, err := fieldValue(b, "total_inactive_file")
	if err != nil {
		return 0, err
	}
	return usage - inactive, nil
}

// fieldValue is the first number after key at the start of a line of b.
func fieldValue(b []byte, key string) (float64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == key {
			return strconv.ParseFloat(string(f[1]), 64)
		}
	}
	return 0, fmt.Errorf("no %s", key)
}

// newCgroup makes a memory cgroup for proxy name under root (a cgroup v1
// memory hierarchy), and a fresh copy of bin in dir whose page cache is
// dropped: the pages the proxy reads are then charged to its cgroup, as a
// pod's are on a node that has not run the image (bench/vs-istio/run.sh's
// mem phase does the same).
func newCgroup(root, name, bin, dir string) (cg, copied string, err error) {
	cg = filepath.Join(root, fmt.Sprintf("meshagent-xdsbench-%d-%s", os.Getpid(), name))
	if err := os.Mkdir(cg, 0o755); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(filepath.Join(cg, "memory.limit_in_bytes"), []byte("1G"), 0o644); err != nil {
		return "", "", err
	}
	copied = filepath.Join(dir, filepath.Base(bin))
	if err := copyEvicted(bin, copied); err != nil {
		return "", "", err
	}
	return cg, copied, nil
}

func copyEvicted(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	defer out.Close()
	if _, err := io.Copy(out, in); err != nil {
		return err
	}
	if err := out.Sync(); err != nil {
		return err
	}
	return unix.Fadvise(int(out.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// inCgroup is the command line that runs argv in cgroup cg: a shell joins
// it, then execs (so the pid is the proxy's).
func inCgroup(cg string, argv []string) []string {
	return append([]string{"/bin/sh", "-c", `echo $$ >"$0/cgroup.procs" && exec "$@"`, cg}, argv...)
}

// removeCgroup removes cg once its processes are gone (the pages still
// charged to it go to its parent).
func removeCgroup(cg string) {
	for range 50 {
		if err := os.Remove(cg); err == nil || os.IsNotExist(err) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
