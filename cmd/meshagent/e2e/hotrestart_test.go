package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// The whole agent with MESHAGENT_HOT_RESTART=true: an edit of the mesh
// config file that changes Envoy's command line and bootstrap (ProxyConfig
// concurrency) is applied by a hot restart, rendered by the agent's own
// translation; a client dialling Envoy's Prometheus listener without pause
// is never refused, readiness holds, and the XDS stream goes to the new
// epoch once (#25).
func TestHotRestartOnMeshConfigEdit(t *testing.T) {
	p := e2ekit.StartAgent(t, []string{"MESHAGENT_HOT_RESTART=true"})
	// Envoy leaves its hot restart shared memory behind (a pod's /dev/shm
	// goes with the pod); the test's goes with the test.
	base := config.HotRestartBaseID(filepath.Join(p.Root, "etc/istio/proxy"))
	testkit.CleanupEnvoySharedMemory(t, base)
	p.WaitStatus(t, "/healthz/ready", 200)
	// Istio's default mesh file, missing at start (a default mesh is used)
	// and then written: its directory is watched from when it appears.
	meshFile := filepath.Join(p.Root, "etc/istio/config/mesh")
	first := p.EnvoyPIDs()[0]
	if args := cmdline(t, first); !strings.Contains(args, "--restart-epoch 0") || strings.Contains(args, "--disable-hot-restart") {
		t.Fatalf("epoch 0's command line: %s", args)
	}
	d := testkit.StartDialer(fmt.Sprintf("127.0.0.1:%d", p.PromPort))
	defer d.Stop()
	// Readiness, asked without pause through the hot restart.
	var notReady []string
	stopProbe, probed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(probed)
		for {
			select {
			case <-stopProbe:
				return
			default:
			}
			if code, body := p.Get("/healthz/ready"); code != 200 {
				notReady = append(notReady, fmt.Sprintf("%d %s", code, body))
			}
		}
	}()
	testkit.WriteFile(t, meshFile, []byte("defaultConfig:\n  concurrency: 2\n"))
	// The old epoch exits after the parent shutdown time (60s, Istio's
	// old value): the service's tests see that; here the takeover will do.
	p.WaitLog(t, "the takeover", func(log string) bool { return strings.Contains(log, "hot restart: the new epoch took over") })
	close(stopProbe)
	<-probed
	d.Stop()
	if len(notReady) > 0 {
		t.Errorf("readiness dropped during the hot restart: %q", notReady)
	}
	accepted, refused, other := d.Counts()
	if refused != 0 || accepted == 0 {
		t.Fatalf("across the hot restart: %d accepted, %d refused, %d other errors (%s)", accepted, refused, other, d.LastError())
	}
	log := p.Stderr.String()
	took := regexp.MustCompile(`hot restart: the new epoch took over.* old_epoch=0 .*new_epoch=1 pid=(\d+).*reason="changed: ` + regexp.QuoteMeta(meshFile))
	m := took.FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no takeover logged with the epochs and the mesh file:\n%s", log)
	}
	var pid int
	fmt.Sscan(m[1], &pid)
	if args := cmdline(t, pid); !strings.Contains(args, "--restart-epoch 1") || !strings.Contains(args, "--concurrency 2") {
		t.Fatalf("epoch 1's command line: %s", args)
	}
	// /debug/tree shows both epochs while the old one drains (60s).
	tree := p.WaitStatus(t, "/debug/tree", 200)
	if want := fmt.Sprintf("hot restart: epoch 1 (pid %d) serving, epoch 0 (pid %d) draining", pid, first); !strings.Contains(tree, want) {
		t.Errorf("/debug/tree does not show the epochs (%s):\n%s", want, tree)
	}
	// The old epoch, draining, does not take the XDS stream back (#25).
	if n := strings.Count(p.Stderr.String(), "a newer Envoy stream replaces the open one"); n > 1 {
		t.Errorf("the XDS stream changed hands %d times during the overlap, want once", n)
	}
}

// cmdline is process pid's command line, space separated.
func cmdline(t *testing.T, pid int) string {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(strings.TrimSuffix(string(raw), "\x00"), "\x00", " ")
}
