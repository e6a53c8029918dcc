package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
)

// BenchmarkAgentExecToEnvoyStarted is a whole-process figure: exec of
// `meshagent proxy` until the Envoy it starts says it is up (the stand-in's
// "started: admin on" line, passed through the agent's stderr).
// BenchmarkExecEnvoyDirect, the baseline, execs the same Envoy directly
// with the bootstrap the agent wrote, until the same line. The difference
// is what the agent adds before Envoy runs.
func BenchmarkAgentExecToEnvoyStarted(b *testing.B) {
	root := b.TempDir()
	if out, err := exec.Command(e2ekit.DevcertsBinary, "-out", filepath.Join(root, "etc/certs")).CombinedOutput(); err != nil {
		b.Fatalf("devcerts: %v %s", err, out)
	}
	for i := 0; i < b.N; i++ {
		cmd := exec.Command(e2ekit.AgentBinary, "proxy", "--root", root)
		cmd.Env = append(os.Environ(), benchAgentEnv(b)...)
		waitForLine(b, cmd, "started: admin on")
	}
}

func BenchmarkExecEnvoyDirect(b *testing.B) {
	root := b.TempDir()
	if out, err := exec.Command(e2ekit.DevcertsBinary, "-out", filepath.Join(root, "etc/certs")).CombinedOutput(); err != nil {
		b.Fatalf("devcerts: %v %s", err, out)
	}
	// One agent run writes the bootstrap the baseline reuses.
	cmd := exec.Command(e2ekit.AgentBinary, "proxy", "--root", root)
	cmd.Env = append(os.Environ(), benchAgentEnv(b)...)
	waitForLine(b, cmd, `msg="envoy started"`)
	bootstrap := filepath.Join(root, "etc/istio/proxy/envoy-rev.json")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		envoy := exec.Command(e2ekit.EnvoyBinary, "-c", bootstrap, "--disable-hot-restart")
		waitForLine(b, envoy, "started: admin on")
	}
}

func benchAgentEnv(b *testing.B) []string {
	free := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port
	}
	return []string{
		fmt.Sprintf(`PROXY_CONFIG={"statusPort":%d,"proxyAdminPort":%d,"binaryPath":%q}`, free(), free(), e2ekit.EnvoyBinary),
		fmt.Sprintf("ENVOY_STATUS_PORT=%d", free()), fmt.Sprintf("ENVOY_PROMETHEUS_PORT=%d", free()),
		"POD_NAME=bench-0", "POD_NAMESPACE=default", "INSTANCE_IP=127.0.0.1",
	}
}

// waitForLine starts cmd, waits until its stderr has a line containing
// marker, then kills it and waits for it.
func waitForLine(b *testing.B, cmd *exec.Cmd, marker string) {
	stderr, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	found := false
	var seen []string
	for sc.Scan() {
		if strings.Contains(sc.Text(), marker) {
			found = true
			break
		}
		seen = append(seen, sc.Text())
	}
	_ = cmd.Process.Kill()
	go io.Copy(io.Discard, stderr) //nolint:errcheck // drain until exit
	_ = cmd.Wait()
	if !found {
		b.Fatalf("%s never printed %q; it printed:\n%s", cmd.Path, marker, strings.Join(seen, "\n"))
	}
}
