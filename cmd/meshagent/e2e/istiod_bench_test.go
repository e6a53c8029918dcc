package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// Start and reconnect against Istio's istiod, meshagent beside Istio's
// agent, interleaved (#24): `PHASES=istiod bench/vs-istio/run.sh` runs it
// with the shipped binary. Each round runs both agents, the order rotated
// each round, on the same istiod (restarted fresh before each agent):
//
//	start → ready       exec to the first 200 of /healthz/ready
//	CPU at ready        the agent's and its Envoy's CPU time then
//	                    (/proc/PID/schedstat of the process tree): what a
//	                    start costs a pod, which decides a start storm on
//	                    a node whose cores are all busy (#36)
//	reconnect           istiod killed, 2 s down, started again: from
//	                    istiod's start (its script run) to istiod's
//	                    syncz listing the proxy with clusters and
//	                    listeners ACKed; also from istiod's ports open,
//	                    which leaves out istiod's own start
//
// Opt-in (MESHAGENT_ISTIOD_BENCH_ROUNDS, the number of rounds): it is a
// measurement, not a check; TestIstiodEndToEnd checks the same chain.
// MESHAGENT_BENCH_AGENT names the meshagent binary (default: the test's
// build); MESHAGENT_BENCH_AGENT_ARGS adds arguments to its command line.
const istiodBenchRoundsEnv = "MESHAGENT_ISTIOD_BENCH_ROUNDS"

func TestIstiodStartReconnectBench(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv(istiodBenchRoundsEnv))
	if rounds <= 0 {
		t.Skip(istiodBenchRoundsEnv + " is not set: a measurement, run by `PHASES=istiod bench/vs-istio/run.sh`")
	}
	if os.Getenv(istiodNetnsEnv) == "" {
		istiodPeerPaths(t)
		rerunInNamespace(t)
		return
	}
	bin, run := istiodPeerPaths(t)
	peer := startIstiodPeer(t, bin, run)
	ours := e2ekit.AgentBinary
	if b := os.Getenv("MESHAGENT_BENCH_AGENT"); b != "" {
		ours = b
	}
	agents, istioMissing := istiodAgents(t, ours)
	if istioMissing != nil {
		t.Skipf("no Istio agent to compare with: %v", istioMissing)
	}
	if extra := strings.Fields(os.Getenv("MESHAGENT_BENCH_AGENT_ARGS")); len(extra) > 0 {
		// For a trace of the start path: --log_output_level default:debug
		// (and MESHAGENT_ISTIOD_LOGS=1 to see the log).
		command := agents[0].command
		agents[0].command = func(root string) *exec.Cmd {
			cmd := command(root)
			cmd.Args = append(cmd.Args, extra...)
			return cmd
		}
	}
	for r := range rounds {
		got := map[string]istiodTimes{}
		for i := range agents {
			a := agents[(i+r)%len(agents)]
			// Each agent meets istiod freshly started, as the first did.
			peer.stop(t)
			peer.Start(t)
			if !t.Run(fmt.Sprintf("round%d/%s", r, a.name), func(t *testing.T) { got[a.name] = startReconnect(t, peer, a) }) {
				return
			}
		}
		m, i := got["meshagent"], got["istio"]
		// One line per round, parsed by bench/vs-istio/run.sh.
		t.Logf("istiod-bench round %d: start-ready-ms %.1f %.1f %.2f start-cpu-ms %.1f %.1f %.2f reconnect-ms %.1f %.1f %.2f reconnect-after-ports-ms %.1f %.1f %.2f",
			r, ms(m.ready), ms(i.ready), ms(m.ready)/ms(i.ready), ms(m.cpu), ms(i.cpu), ms(m.cpu)/ms(i.cpu),
			ms(m.reconnect), ms(i.reconnect), ms(m.reconnect)/ms(i.reconnect),
			ms(m.afterPorts), ms(i.afterPorts), ms(m.afterPorts)/ms(i.afterPorts))
	}
}

// istiodTimes are one agent's figures in one round.
type istiodTimes struct{ ready, cpu, reconnect, afterPorts time.Duration }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// startReconnect starts the agent, waits until it is ready and istiod has
// it synced, then restarts istiod after 2 s down and times the
// reconnection.
func startReconnect(t *testing.T, peer *istiodPeer, a istiodAgent) istiodTimes {
	var r istiodTimes
	p, start := launchAgainstIstiod(t, peer, a)
	testkit.WaitFor(t, "/healthz/ready 200", func() bool { code, _ := p.Get("/healthz/ready"); return code == 200 })
	r.ready = time.Since(start)
	r.cpu = treeCPU(p.Cmd.Process.Pid)
	testkit.WaitFor(t, "istiod to have the proxy synced", istiodSees)

	peer.stop(t)
	time.Sleep(2 * time.Second)
	restarted := time.Now()
	peer.Start(t)
	ports := time.Now()
	testkit.WaitFor(t, "the agent to reconnect to the restarted istiod", istiodSees)
	r.reconnect, r.afterPorts = time.Since(restarted), time.Since(ports)
	return r
}

// treeCPU is the CPU time of process pid and its descendants so far: user
// and system time of its threads, of its children that exited (the
// capture check's iptables-save) and of those alive, from /proc/PID/stat
// (in clock ticks, 10 ms); a process gone meanwhile counts nothing.
func treeCPU(pid int) time.Duration {
	var sum time.Duration
	if _, f, err := testkit.ProcStat(pid); err == nil {
		// The fields after the command name: state is the first; utime,
		// stime, cutime, cstime the 12th-15th.
		if len(f) > 14 {
			for _, v := range f[11:15] {
				ticks, _ := strconv.ParseInt(v, 10, 64)
				sum += time.Duration(ticks) * 10 * time.Millisecond // USER_HZ, 100 on Linux
			}
		}
	}
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, c := range strings.Fields(string(b)) {
			if child, err := strconv.Atoi(c); err == nil {
				sum += treeCPU(child)
			}
		}
	}
	return sum
}
