package e2ekit

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// The agent's upstream in these tests is a real control plane
// (go-control-plane, testdata/testkit/xdsserver) on loopback, plaintext:
// the agent's XDS proxy forwards the stand-in Envoy's ADS stream to it, and
// Envoy turns ready only once its clusters and listeners have arrived, as a
// real Envoy does.

// XDSHelperEnv makes the test binary a control plane listening on the
// variable's address until it is signalled: the agent in a network
// namespace reaches its control plane on that namespace's loopback.
const XDSHelperEnv = "MESHAGENT_XDS_HELPER"

// StartControlPlane serves xdsserver.SmallMesh("v1", "e2e") on a free loopback port
// until the test ends.
func StartControlPlane(t *testing.T) *xdsserver.Server {
	t.Helper()
	cp, err := ServeMesh("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	return cp
}

func ServeMesh(addr string) (*xdsserver.Server, error) {
	return xdsserver.StartSmallMesh(xdsserver.Options{Addr: addr}, "e2e", nil)
}

// StartControlPlaneIn runs a control plane on addr inside the network
// namespace ns (the test binary in helper mode).
func StartControlPlaneIn(t *testing.T, ns, addr string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, self)
	cmd.Env = append(os.Environ(), XDSHelperEnv+"="+addr)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
}

// RunXDSHelper is the test binary as a control plane (xdsHelperEnv).
func RunXDSHelper(addr string) int {
	cp, err := ServeMesh(addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "control plane helper:", err)
		return 1
	}
	defer cp.Close()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
	return 0
}
