package tree

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/services/capture"
	"github.com/meshagent/meshagent/services/controlplane"
	"github.com/meshagent/meshagent/services/nametable"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// Build makes every service the same way, and reports every bad config at
// once, each named by its service (#26): the capture service and the
// embedded peers used to find theirs only in Serve, after the tree started.
func TestBuildReportsEveryBadService(t *testing.T) {
	bad := capture.RulesConfig{ProxyPort: "x"}
	cfg := Config{
		Capture:      &capture.Config{Mode: capture.VM, Rules: bad},
		CA:           &ca.Config{},
		ControlPlane: &controlplane.Config{Listen: "127.0.0.1:0"},
		NameTable:    &nametable.Config{},
		StopTimeout:  time.Second,
	}
	_, _, err := Build(cfg, prometheus.NewRegistry(), testkit.TestLogger(t), Process{})
	if err == nil {
		t.Fatal("Build accepted bad configs")
	}
	for _, want := range []string{"capture: ", "ca: ", "controlplane: ", "nametable: "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Build error does not name %q:\n%v", want, err)
		}
	}
}
