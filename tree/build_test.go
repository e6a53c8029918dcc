package tree

import (
	"maps"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/services/capture"
	"github.com/meshagent/meshagent/services/controlplane"
	"github.com/meshagent/meshagent/services/dnsproxy"
	"github.com/meshagent/meshagent/services/envoy"
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
	_, _, err := Build(cfg, testkit.TestLogger(t), Process{Clock: testkit.NewManualClock(), Metrics: prometheus.NewRegistry()})
	if err == nil {
		t.Fatal("Build accepted bad configs")
	}
	for _, want := range []string{"capture: ", "ca: ", "controlplane: ", "nametable: "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Build error does not name %q:\n%v", want, err)
		}
	}
}

// Build takes its clock and registry from its caller (issue 34): without
// them it refuses, naming them.
func TestBuildNeedsClockAndRegistry(t *testing.T) {
	for _, proc := range []Process{{Metrics: prometheus.NewRegistry()}, {Clock: testkit.NewManualClock()}} {
		if _, _, err := Build(Config{}, testkit.TestLogger(t), proc); err == nil || !strings.Contains(err.Error(), "Process.Clock and Process.Metrics") {
			t.Errorf("Build with %+v = %v", proc, err)
		}
	}
}

// The status server's debug pages read what the services publish, never a
// built service (issue 34): /debug/ndsz renders the table the DNS proxy
// put on its channel, and is there only when the agent has a DNS proxy.
func TestDebugPagesReadChannels(t *testing.T) {
	ch := NewChannels(nil)
	if pages := debugPages(Config{}, ch); len(pages) != 0 {
		t.Errorf("pages without a DNS proxy or crash directory: %v", slices.Collect(maps.Keys(pages)))
	}
	pages := debugPages(Config{DNS: &dnsproxy.Config{}, Envoy: &envoy.Config{CrashDir: t.TempDir()}}, ch)
	if _, ok := pages["/debug/crashes"]; !ok {
		t.Error("no /debug/crashes with a crash directory")
	}
	ndsz, ok := pages["/debug/ndsz"]
	if !ok {
		t.Fatal("no /debug/ndsz with a DNS proxy")
	}
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		ndsz.Handler.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/ndsz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, _ := get(); code != 503 {
		t.Errorf("before the DNS proxy answers: %d, want 503", code)
	}
	ch.DNS.Send(messages.DNSTable{Namespace: "default", Domain: "cluster.local", Table: messages.NameTable{Version: "v3",
		Hosts: map[string]messages.NameInfo{"reviews.default.svc.cluster.local": {IPs: []netip.Addr{netip.MustParseAddr("10.0.0.7")},
			Registry: "Kubernetes", Shortname: "reviews", Namespace: "default"}}}})
	if code, body := get(); code != 200 || !strings.Contains(body, `"version": "v3"`) || !strings.Contains(body, "reviews.default.svc.") {
		t.Errorf("after the DNS proxy published its table: %d %s", code, body)
	}
}
