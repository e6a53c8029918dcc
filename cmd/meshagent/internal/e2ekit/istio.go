package e2ekit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// CanUseNetns says whether runs can have their own namespaces (root, unshare, ip).
func CanUseNetns() (bool, string) {
	return testkit.CanRoot("network namespaces", "unshare", "ip", "mount")
}

// IstioAgentBinary is Istio's pilot-agent: MESHAGENT_ISTIO_AGENT, or where
// the peers' build.sh leaves it.
func IstioAgentBinary() (string, error) {
	p := os.Getenv("MESHAGENT_ISTIO_AGENT")
	if p == "" {
		home, _ := os.UserHomeDir()
		p = filepath.Join(home, ".cache", "meshagent-peers", "pilot-agent")
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("Istio's pilot-agent: %w (set MESHAGENT_ISTIO_AGENT, or `make conformance` builds it)", err)
	}
	return p, nil
}

// IstioSourceVersion is the Istio module the peer agent is built from
// (shared/peers/istio-agent/go.mod).
const IstioSourceVersion = "istio.io/istio@v0.0.0-20260827124520-eed52ebb66ad"

// IstioSource is Istio's source: MESHAGENT_ISTIO_SRC, or the module cache.
func IstioSource() (string, error) {
	p := os.Getenv("MESHAGENT_ISTIO_SRC")
	if p == "" {
		out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "env", "GOMODCACHE").Output()
		if err != nil {
			return "", err
		}
		p = filepath.Join(strings.TrimSpace(string(out)), IstioSourceVersion)
	}
	if _, err := os.Stat(filepath.Join(p, IstioTemplateSource)); err != nil {
		return "", fmt.Errorf("Istio's source: %w (set MESHAGENT_ISTIO_SRC)", err)
	}
	return p, nil
}

// IstioPeer is Istio's pilot-agent and Istio's source beside it (its
// bootstrap template, its golden inputs): what a test that runs Istio's
// agent as the oracle needs; the error says which one is missing.
func IstioPeer() (agent, src string, err error) {
	if agent, err = IstioAgentBinary(); err != nil {
		return "", "", err
	}
	if src, err = IstioSource(); err != nil {
		return "", "", err
	}
	return agent, src, nil
}

// IstioTemplatePath is where Istio's agent looks for its bootstrap template
// (pkg/bootstrap DefaultCfgDir); the proxyv2 image ships it there.
const IstioTemplatePath = "var/lib/istio/envoy/envoy_bootstrap_tmpl.json"

// IstioTemplateSource is Istio's template in its source.
const IstioTemplateSource = "tools/packaging/common/envoy_bootstrap.json"
