package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// The route the agent's bootstrap puts before Istio's on :15021 (#36),
// with the admin layer Istio's bootstrap has.
const readinessBootstrap = `{
  "layered_runtime": {"layers": [
    {"name": "global config", "static_layer": {"overload.global_downstream_max_connections": 2147483647}},
    {"name": "admin", "admin_layer": {}}
  ]},
  "static_resources": {
    "listeners": [{
      "name": "0.0.0.0_15021",
      "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
      "filter_chains": [{"filters": [{
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
          "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
          "stat_prefix": "agent",
          "route_config": {"virtual_hosts": [{"name": "backend", "domains": ["*"], "routes": [
            {"match": {"prefix": "/healthz/ready", "runtime_fraction": {"default_value": {"numerator": 0, "denominator": "HUNDRED"}, "runtime_key": "meshagent.agent_ready"}},
             "direct_response": {"status": 200, "body": {"inline_string": "ready\n"}}},
            {"match": {"prefix": "/healthz/ready"}, "route": {"cluster": "agent"}}
          ]}]},
          "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
        }
      }]}]
    }],
    "clusters": [{"name": "agent", "type": "STATIC", "connect_timeout": "0.25s",
      "load_assignment": {"cluster_name": "agent", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": AGENT}}}}]}]}}]
  }
}`

func TestRuntimeFractionRouteFollowsTheAdminLayer(t *testing.T) {
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready: the agent's reason", http.StatusServiceUnavailable)
	}))
	defer agent.Close()
	boot := &bootstrapv3.Bootstrap{}
	raw := []byte(replacePort(readinessBootstrap, agent.Listener.Addr().String()))
	if err := protojson.Unmarshal(raw, boot); err != nil {
		t.Fatal(err)
	}
	e := newEnvoy(boot, knobs{})
	routes := e.httpRoutes(boot.GetStaticResources().GetListeners()[0])
	probe := func() (int, string) {
		rec := httptest.NewRecorder()
		routes.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz/ready", nil))
		return rec.Code, rec.Body.String()
	}
	modify := func(method, query string) int {
		rec := httptest.NewRecorder()
		e.adminMux(make(chan int, 1)).ServeHTTP(rec, httptest.NewRequest(method, "/runtime_modify?"+query, nil))
		return rec.Code
	}

	// The default (0): forwarded to the agent.
	if code, body := probe(); code != 503 || body != "not ready: the agent's reason\n" {
		t.Fatalf("key absent: %d %q, want the agent's 503", code, body)
	}
	if code := modify("GET", "meshagent.agent_ready=100"); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /runtime_modify: %d, want 405 (Envoy takes only POST)", code)
	}
	if code := modify("POST", "meshagent.agent_ready=100"); code != 200 {
		t.Fatalf("POST /runtime_modify: %d", code)
	}
	for range 20 { // 100 of HUNDRED: every request
		if code, body := probe(); code != 200 || body != "ready\n" {
			t.Fatalf("key 100: %d %q, want Envoy's own 200", code, body)
		}
	}
	if v, _ := e.runtimeValue("overload.global_downstream_max_connections"); v != "2147483647" {
		t.Fatalf("static layer value = %q", v)
	}
	modify("POST", "meshagent.agent_ready=0")
	for range 20 {
		if code, _ := probe(); code != 503 {
			t.Fatalf("key 0: %d, want the agent's 503", code)
		}
	}

	// Without an admin layer Envoy refuses to modify its runtime.
	boot.LayeredRuntime.Layers = boot.LayeredRuntime.Layers[:1]
	if code := modify("POST", "meshagent.agent_ready=100"); code != http.StatusServiceUnavailable {
		t.Fatalf("POST /runtime_modify without an admin layer: %d, want 503", code)
	}
}

// replacePort puts the agent's port (of host:port) where AGENT stands.
func replacePort(s, hostPort string) string {
	_, port, _ := net.SplitHostPort(hostPort)
	return strings.Replace(s, "AGENT", port, 1)
}
