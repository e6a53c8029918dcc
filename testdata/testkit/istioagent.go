package testkit

import (
	"fmt"
	"os"
	"path/filepath"
)

// IstioAgentBinary is the path of Istio's own pilot-agent, the oracle of
// the differential tests: MESHAGENT_ISTIO_AGENT, else the one the peers'
// build.sh leaves in ~/.cache/meshagent-peers; "" with why not.
func IstioAgentBinary() (string, string) {
	if p := os.Getenv("MESHAGENT_ISTIO_AGENT"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Sprintf("MESHAGENT_ISTIO_AGENT=%s: %v", p, err)
		}
		return p, ""
	}
	home, _ := os.UserHomeDir()
	p := filepath.Join(home, ".cache", "meshagent-peers", "pilot-agent")
	if _, err := os.Stat(p); err != nil {
		return "", "Istio's pilot-agent not found: set MESHAGENT_ISTIO_AGENT or run shared/peers/istio-agent/build.sh"
	}
	return p, ""
}
