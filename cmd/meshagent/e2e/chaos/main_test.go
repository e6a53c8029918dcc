// Package chaos kills the agent's services, Envoy and its peers while the
// built agent serves, and checks that it heals (make chaos). Its harness is
// cmd/meshagent/internal/e2ekit (#26).
package chaos

import (
	"testing"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
)

func TestMain(m *testing.M) { e2ekit.Main(m) }
