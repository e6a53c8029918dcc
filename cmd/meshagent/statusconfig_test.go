package main

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/services/status"
	"github.com/meshagent/meshagent/services/status/appprobe"
	"github.com/meshagent/meshagent/services/status/metricsmerge"
)

// The status server's settings from Istio's environment, through the whole
// configuration pipeline: what each variable turns into, with Istio's
// defaults when nothing is set.
func TestStatusConfigFromIstiosEnvironment(t *testing.T) {
	const probers = `{"/app-health/web/livez":{"httpGet":{"path":"/hz","port":8080,"scheme":"HTTP"},"timeoutSeconds":3}}`
	const vmProbe = `{"readinessProbe":{"tcpSocket":{"port":7070},"periodSeconds":5}}`
	for _, tc := range []struct {
		name  string
		env   map[string]string
		args  []string
		check func(t *testing.T, c *status.Config)
	}{
		{"nothing set: Istio's defaults", nil, nil, func(t *testing.T, c *status.Config) {
			want := appprobe.Config{}
			if !reflect.DeepEqual(c.Probes, want) {
				t.Errorf("probes = %+v, want none, to localhost, HTTP/2 allowed, no keep-alive", c.Probes)
			}
			if c.Metrics.EnvoyPort != 15090 || c.Metrics.App != nil || c.Metrics.LocalhostOnly {
				t.Errorf("metrics = %+v, want Envoy's 15090 merged, no application, any caller", c.Metrics)
			}
		}},
		{"application probes to the pod's IP", map[string]string{"ISTIO_KUBE_APP_PROBERS": probers, "INSTANCE_IP": "10.1.2.3,fd00::3"}, nil,
			func(t *testing.T, c *status.Config) {
				p, ok := c.Probes.App["/app-health/web/livez"]
				if !ok || p.HTTPGet == nil || p.HTTPGet.Port != 8080 || p.HTTPGet.Path != "/hz" || p.TimeoutSeconds != 3 {
					t.Errorf("app probes = %+v", c.Probes.App)
				}
				if c.Probes.Host != "10.1.2.3" {
					t.Errorf("probe host %q, want INSTANCE_IP's first address", c.Probes.Host)
				}
			}},
		{"legacy localhost destination", map[string]string{"INSTANCE_IP": "10.1.2.3", "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION": "true"}, nil,
			func(t *testing.T, c *status.Config) {
				if c.Probes.Host != "localhost" {
					t.Errorf("probe host %q, want localhost", c.Probes.Host)
				}
			}},
		{"HTTP/2 off, keep-alive on", map[string]string{"ISTIO_ENABLE_HTTP2_PROBING": "false", "ENABLE_PROBE_KEEPALIVE_CONNECTIONS": "true"}, nil,
			func(t *testing.T, c *status.Config) {
				if !c.Probes.DisableHTTP2 || !c.Probes.KeepAlive {
					t.Errorf("probes = %+v, want HTTP/2 disabled and keep-alive", c.Probes)
				}
			}},
		{"VM readiness probe from ProxyConfig", map[string]string{"PROXY_CONFIG": vmProbe}, nil, func(t *testing.T, c *status.Config) {
			w := c.Probes.Workload
			if w == nil || w.TCPSocket == nil || w.TCPSocket.Port != 7070 || w.Period != 5*time.Second || w.Timeout != time.Second {
				t.Errorf("workload probe = %+v, want tcp 7070 every 5s, Istio's 1s timeout", w)
			}
		}},
		{"Envoy's Prometheus port", map[string]string{"ENVOY_PROMETHEUS_PORT": "25090"}, nil, func(t *testing.T, c *status.Config) {
			if c.Metrics.EnvoyPort != 25090 {
				t.Errorf("Envoy's metrics from %d, want 25090", c.Metrics.EnvoyPort)
			}
		}},
		{"Envoy's stats not merged", map[string]string{"PILOT_AGENT_MERGE_ENVOY_STATS": "false"}, nil, func(t *testing.T, c *status.Config) {
			if c.Metrics.EnvoyPort != 0 {
				t.Errorf("Envoy's metrics from %d, want none", c.Metrics.EnvoyPort)
			}
		}},
		{"no Envoy", map[string]string{"DISABLE_ENVOY": "true"}, nil, func(t *testing.T, c *status.Config) {
			if c.Metrics.EnvoyPort != 0 {
				t.Errorf("Envoy's metrics from %d, want none", c.Metrics.EnvoyPort)
			}
		}},
		{"application metrics, sidecar", map[string]string{"ISTIO_PROMETHEUS_ANNOTATIONS": `{"scrape":"true","path":"/stats","port":"9090"}`}, nil,
			func(t *testing.T, c *status.Config) {
				if want := []metricsmerge.ScrapeTarget{{Port: 9090, Path: "/stats"}}; !reflect.DeepEqual(c.Metrics.App, want) {
					t.Errorf("application targets %+v, want %+v", c.Metrics.App, want)
				}
			}},
		{"application metrics ignored by a gateway", map[string]string{"ISTIO_PROMETHEUS_ANNOTATIONS": `{"scrape":"true","port":"9090"}`}, []string{"router"},
			func(t *testing.T, c *status.Config) {
				if c.Metrics.App != nil {
					t.Errorf("a gateway scrapes the application: %+v", c.Metrics.App)
				}
			}},
		{"metrics for loopback callers only", map[string]string{"METRICS_LOCALHOST_ACCESS_ONLY": "true"}, nil, func(t *testing.T, c *status.Config) {
			if !c.Metrics.LocalhostOnly {
				t.Error("METRICS_LOCALHOST_ACCESS_ONLY=true did not reach the agent's endpoint")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseForTest(t, tc.env, append([]string{"--root", testRoot(t)}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.tree.Status == nil {
				t.Fatal("no status server")
			}
			tc.check(t, cfg.tree.Status)
		})
	}
}

// Every bad value of the status server's settings stops the start (exit
// code 2), each named with its variable, all of them in one run.
func TestStatusConfigRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want []string // in the error
	}{
		{map[string]string{"ISTIO_KUBE_APP_PROBERS": `{"/healthz":{"tcpSocket":{"port":8080}}}`}, []string{"ISTIO_KUBE_APP_PROBERS", `"/healthz"`}},
		{map[string]string{"ISTIO_KUBE_APP_PROBERS": `{"/app-health/web/livez":{"httpGet":{"port":"http"}}}`}, []string{"ISTIO_KUBE_APP_PROBERS", "named ports"}},
		{map[string]string{"ISTIO_KUBE_APP_PROBERS": `not json`}, []string{"ISTIO_KUBE_APP_PROBERS"}},
		{map[string]string{"REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION": "yes"}, []string{`REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION="yes"`}},
		{map[string]string{"ISTIO_ENABLE_HTTP2_PROBING": "maybe"}, []string{`ISTIO_ENABLE_HTTP2_PROBING="maybe"`}},
		{map[string]string{"ENABLE_PROBE_KEEPALIVE_CONNECTIONS": "2"}, []string{`ENABLE_PROBE_KEEPALIVE_CONNECTIONS="2"`}},
		{map[string]string{"PROXY_CONFIG": `{"readinessProbe":{"periodSeconds":5}}`}, []string{"readinessProbe", "no httpGet, tcpSocket, grpc or exec"}},
		{map[string]string{"PILOT_AGENT_MERGE_ENVOY_STATS": "off"}, []string{`PILOT_AGENT_MERGE_ENVOY_STATS="off"`}},
		{map[string]string{"METRICS_LOCALHOST_ACCESS_ONLY": "sure"}, []string{`METRICS_LOCALHOST_ACCESS_ONLY="sure"`}},
		{map[string]string{"ISTIO_PROMETHEUS_ANNOTATIONS": `{"scrape":"true","port":"15020"}`}, []string{"ISTIO_PROMETHEUS_ANNOTATIONS", "15020"}},
		// The configured status port, not only Istio's 15020, would loop.
		{map[string]string{"PROXY_CONFIG": `{"statusPort":25020}`, "ISTIO_PROMETHEUS_ANNOTATIONS": `{"port":"25020"}`}, []string{"ISTIO_PROMETHEUS_ANNOTATIONS", "25020"}},
		{map[string]string{"ISTIO_PROMETHEUS_ANNOTATIONS": `{"port":`}, []string{"ISTIO_PROMETHEUS_ANNOTATIONS"}},
	} {
		_, err := parseForTest(t, tc.env, "--root", testRoot(t))
		if err == nil {
			t.Errorf("%v: accepted", tc.env)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q does not name %s", tc.env, err, w)
			}
		}
	}

	// All at once, and ENVOY_PROMETHEUS_PORT (read by Envoy's builder, used
	// by both) reported once.
	_, err := parseForTest(t, map[string]string{
		"ISTIO_KUBE_APP_PROBERS": "[]", "ISTIO_ENABLE_HTTP2_PROBING": "maybe", "ENVOY_PROMETHEUS_PORT": "0",
		"METRICS_LOCALHOST_ACCESS_ONLY": "sure", "ISTIO_PROMETHEUS_ANNOTATIONS": `{"port":"15000"}`,
	}, "--root", testRoot(t))
	if err == nil {
		t.Fatal("bad values accepted")
	}
	for _, name := range []string{"ISTIO_KUBE_APP_PROBERS", "ISTIO_ENABLE_HTTP2_PROBING", "METRICS_LOCALHOST_ACCESS_ONLY", "ISTIO_PROMETHEUS_ANNOTATIONS"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("%s missing from %q", name, err)
		}
	}
	if n := strings.Count(err.Error(), `ENVOY_PROMETHEUS_PORT="0"`); n != 1 {
		t.Errorf(`ENVOY_PROMETHEUS_PORT="0" reported %d times, want once: %q`, n, err)
	}
}

// With statusPort 0 there is no status server, and its variables are not
// read, as in Istio. (Envoy's bootstrap needs the port: no Envoy either.)
func TestNoStatusServerWithStatusPortZero(t *testing.T) {
	env := map[string]string{"PROXY_CONFIG": `{"statusPort":0}`, "DISABLE_ENVOY": "true", "ISTIO_KUBE_APP_PROBERS": "not json"}
	cfg, err := parseForTest(t, env, "--root", testRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.tree.Status != nil {
		t.Fatalf("status server with statusPort 0: %+v", cfg.tree.Status)
	}
}
