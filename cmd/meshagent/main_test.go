package main

import (
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
)

// The commands' own tests use the built binaries too (the stand-in Envoy's
// description, the systemd unit's check, Istio's agent beside ours in
// istio-iptables), and re-run the test binary as a CLI child.
func TestMain(m *testing.M) { e2ekit.Main(m) }
