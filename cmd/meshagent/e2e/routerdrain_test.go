package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// A router's drain on SIGTERM with EXIT_ON_ZERO_ACTIVE_CONNECTIONS,
// compared with Istio's own pilot-agent (#35): both ask the stand-in Envoy
// for drain_listeners?graceful (every listener, not inboundonly), and both
// exit once its client connections are gone, although its HBONE internal
// listeners (envoy_internal_*) keep pipe connections open: Istio 1.30.3
// leaves them out of the count (releasenotes 60731). An agent counting
// them would wait out the 120 s drain (Istio's own: forever).
func TestRouterDrainAgainstIstio(t *testing.T) {
	istioAgent, istioSrc, err := e2ekit.IstioPeer()
	if err != nil {
		t.Skip(err)
	}
	template, err := os.ReadFile(filepath.Join(istioSrc, e2ekit.IstioTemplateSource))
	if err != nil {
		t.Fatal(err)
	}
	for _, ours := range []bool{false, true} {
		who := map[bool]string{false: "Istio's agent", true: "meshagent"}[ours]
		t.Run(who, func(t *testing.T) {
			dir := testkit.ShortTempDir(t, "rd")
			if out, err := exec.Command(e2ekit.DevcertsBinary, "-out", filepath.Join(dir, "etc/certs")).CombinedOutput(); err != nil {
				t.Fatalf("devcerts: %v\n%s", err, out)
			}
			// Istio's agent reads its bootstrap template from the image.
			testkit.WriteFile(t, filepath.Join(dir, e2ekit.IstioTemplatePath), template)
			ports := e2ekit.FreePorts(t, 4)
			args, binary := []string{"proxy", "router"}, istioAgent
			if ours {
				args, binary = append(args, "--root", dir), e2ekit.AgentBinary
			}
			cmd := exec.Command(binary, args...)
			cmd.Dir = dir
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "CLOUD_PLATFORM=none", "FILE_MOUNTED_CERTS=true",
				"INSTANCE_IP=127.0.0.1", "POD_NAME=gateway-0", "POD_NAMESPACE=default", "SERVICE_ACCOUNT=default",
				fmt.Sprintf("ENVOY_STATUS_PORT=%d", ports[2]), fmt.Sprintf("ENVOY_PROMETHEUS_PORT=%d", ports[3]),
				"EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true", "MINIMUM_DRAIN_DURATION=1s",
				// The stand-in: 3 client connections that end within a second
				// of the drain, and a waypoint's internal listeners that never do.
				"FAKE_ENVOY_ACTIVE_CONNECTIONS=3", "FAKE_ENVOY_DRAIN_SECONDS=1",
				fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"binaryPath":%q,"discoveryAddress":"127.0.0.1:1",`+
					`"controlPlaneAuthPolicy":"NONE","terminationDrainDuration":"120s"}`, ports[0], ports[1], e2ekit.EnvoyBinary)}
			log := &testkit.LogBuffer{}
			cmd.Stdout = log // Istio's agent logs there, and the stand-in's stderr to stderr
			p := &e2ekit.AgentProcess{Cmd: cmd, Stderr: log, Exited: make(chan error, 1)}
			p.Start(t)
			admin := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				code, body := e2ekit.HTTPGet(admin + "/stats?filter=envoy_internal")
				if code == 200 && strings.Contains(body, "envoy_internal_main_internal") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: the stand-in's admin did not answer in 30 s:\n%s", who, e2ekit.Tail(log.String(), 30))
				}
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			// A hang guard, not a timing check: the drain is 120 s.
			select {
			case err := <-p.Exited:
				p.Exited <- err // for Start's cleanup
			case <-time.After(60 * time.Second):
				t.Fatalf("%s still draining 60 s after SIGTERM: it counts the internal listeners\n%s", who, e2ekit.Tail(log.String(), 30))
			}
			// Istio: "There are no more active connections"; ours: "no more
			// active connections": the drain ended on the count, not otherwise.
			if !strings.Contains(log.String(), "no more active connections") {
				t.Errorf("%s did not end its drain on zero active connections:\n%s", who, e2ekit.Tail(log.String(), 30))
			}
			if !strings.Contains(log.String(), "drain_listeners?graceful") || strings.Contains(log.String(), "drain_listeners?inboundonly") {
				t.Errorf("%s: the stand-in did not log drain_listeners?graceful (every listener):\n%s", who, e2ekit.Tail(log.String(), 30))
			}
		})
	}
}
