// Package conformance compares the built agent with Istio's pilot-agent on
// the same inputs (docs/conformance.md): recorded goldens in `make test`,
// both agents live in `make conformance`. Its harness is
// cmd/meshagent/internal/e2ekit (#26).
package conformance

import (
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
)

func TestMain(m *testing.M) { e2ekit.Main(m) }
