package capture

import (
	"github.com/meshagent/meshagent/testdata/testkit"
)

// testRules is istio-iptables' config with no flag given, as cmd builds
// it: the env table's defaults (#34) and istio-iptables' flag-only
// --envoy-port and uid (cmd's istio.go).
func testRules(t testkit.Failer) RulesConfig {
	cfg := RulesConfig{ProxyPort: "15001", ProxyUID: "1337", ProxyGID: "1337"}
	testkit.FillFromTable(t, &cfg)
	return cfg
}
