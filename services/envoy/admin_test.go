package envoy

import (
	"testing"

	"github.com/meshagent/meshagent/services/envoy/bootstrap"
)

// The counting rules of Istio's activeProxyConnections, on the kind of text
// a sidecar's Envoy answers to /stats?usedonly&filter=downstream_cx_active$.
func TestSumActiveConnections(t *testing.T) {
	excluded := bootstrap.Config{EnvoyStatusPort: 15021, EnvoyPrometheusPort: 15090}.AgentListenerStats()
	for _, tc := range []struct {
		name  string
		stats string
		want  int
	}{
		{"no stats", "", -1},
		{"only the agent's own listeners", `http.agent.downstream_cx_active: 1
listener.0.0.0.0_15021.downstream_cx_active: 2
listener.0.0.0.0_15090.downstream_cx_active: 3
listener.[__]_15021.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
listener.admin.main_thread.downstream_cx_active: 1
`, 0},
		{"inbound and outbound, minus duplicates", `http.inbound_0.0.0.0_8080.downstream_cx_active: 4
listener.0.0.0.0_15006.downstream_cx_active: 4
listener.0.0.0.0_15006.worker_0.downstream_cx_active: 3
listener.0.0.0.0_15006.worker_1.downstream_cx_active: 1
listener.0.0.0.0_15001.downstream_cx_active: 2
listener.envoy_internal_connect_originate.downstream_cx_active: 9
listener.0.0.0.0_15021.downstream_cx_active: 5
`, 6},
		{"unparsable lines are skipped", "listener.0.0.0.0_15006.downstream_cx_active: x\ngarbage\nlistener.10.0.0.1_80.downstream_cx_active: 1\n", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sumActiveConnections(tc.stats, excluded); got != tc.want {
				t.Fatalf("sum = %d; want %d", got, tc.want)
			}
		})
	}
}
