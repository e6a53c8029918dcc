// Package e2e runs the built agent as a user, kubelet or systemd would: the
// binary, the stand-in Envoy and real control planes and CAs on loopback.
// The harness they share with the chaos and conformance suites is
// cmd/meshagent/internal/e2ekit (#26).
package e2e

import (
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
)

func TestMain(m *testing.M) { e2ekit.Main(m) }
