package envoy

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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

// An admin answer past the bound is an error naming it, not a silent cut
// (#33).
func TestAdminAnswerPastTheBoundIsAnError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for range maxAdminAnswer/len(chunk) + 1 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	a := newAdminClient(strings.TrimPrefix(srv.URL, "http://"))
	defer a.closeIdle()
	_, _, err := a.do(context.Background(), http.MethodGet, "/stats", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "answer cut at 4 MiB (the bound)") {
		t.Fatalf("do = %v; want the bound named", err)
	}
}
