package status

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// treeRequest sends GET path to the server's routes from remote.
func treeRequest(s *Service, path, remote string, header http.Header) *httptest.ResponseRecorder {
	return request(s.routes(), http.MethodGet, path, remote, header)
}

// request sends method path to h from remote, with header's fields: the
// one way these tests call a handler.
func request(h http.Handler, method, path, remote string, header http.Header) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, nil)
	req.RemoteAddr = remote
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// /debug/tree names every service, its last error and the control plane:
// loopback callers only, as pprof and /debug/ndsz. A header naming
// loopback is the caller's word, not its address.
func TestDebugTreeIsLoopbackOnly(t *testing.T) {
	f := newFixture(Config{})
	f.tree.Send(messages.TreeState{Services: []messages.ServiceInfo{{Name: "dns", Path: "names/dns", StateName: "ready"}}})
	spoofed := http.Header{"X-Forwarded-For": {"127.0.0.1"}, "X-Real-Ip": {"127.0.0.1"}, "Forwarded": {"for=127.0.0.1"}}
	for _, c := range []struct {
		remote string
		header http.Header
		want   int
	}{
		{"192.0.2.10:40000", nil, http.StatusForbidden},
		{"192.0.2.10:40000", spoofed, http.StatusForbidden},
		{"[2001:db8::1]:40000", nil, http.StatusForbidden},
		{"127.0.0.1:40000", nil, http.StatusOK},
		{"[::1]:40000", nil, http.StatusOK},
	} {
		for _, path := range []string{"/debug/tree", "/debug/tree?format=json"} {
			rec := treeRequest(f.svc, path, c.remote, c.header)
			if rec.Code != c.want {
				t.Errorf("GET %s from %s (headers %v) = %d, want %d", path, c.remote, c.header, rec.Code, c.want)
			}
			if got := strings.Contains(rec.Body.String(), "dns"); got != (c.want == http.StatusOK) {
				t.Errorf("GET %s from %s: the tree shown: %v\n%s", path, c.remote, got, rec.Body.String())
			}
		}
	}
}

// treeJSON is /debug/tree?format=json as a client reads it.
type treeJSON struct {
	Services []messages.ServiceInfo `json:"services"`
	XDS      *struct {
		Reported  bool              `json:"reported"`
		Upstream  string            `json:"upstream"`
		Address   string            `json:"address"`
		Since     time.Time         `json:"since"`
		LastError string            `json:"last_error"`
		LastACK   map[string]string `json:"last_ack"`
	} `json:"xds"`
}

func getTree(t *testing.T, s *Service) (text string, js treeJSON) {
	t.Helper()
	text = treeRequest(s, "/debug/tree", "127.0.0.1:1", nil).Body.String()
	body := treeRequest(s, "/debug/tree?format=json", "127.0.0.1:1", nil).Body.String()
	if err := json.Unmarshal([]byte(body), &js); err != nil {
		t.Fatalf("/debug/tree?format=json is not JSON: %v\n%s", err, body)
	}
	return text, js
}

// Without an XDS proxy the tree says nothing of one.
func TestDebugTreeWithoutXDSProxy(t *testing.T) {
	f := newFixture(Config{})
	text, js := getTree(t, f.svc)
	if strings.Contains(text, "xds upstream") || js.XDS != nil {
		t.Fatalf("no XDS input, yet the tree shows one:\n%s\n%+v", text, js.XDS)
	}
}

// The XDS proxy's upstream is shown under the tree and in the JSON: where
// Envoy's configuration comes from, since when, why not from the control
// plane, and what Envoy last accepted.
func TestDebugTreeShowsXDSUpstream(t *testing.T) {
	f := newFixture(Config{})
	xds := messages.NewCell[messages.XDSState]()
	f.svc.in.XDS = xds

	text, js := getTree(t, f.svc)
	if !strings.Contains(text, "xds upstream: no report yet") || js.XDS == nil || js.XDS.Reported {
		t.Fatalf("before any report:\n%s\n%+v", text, js.XDS)
	}

	since := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	acks := map[string]string{
		"type.googleapis.com/envoy.config.listener.v3.Listener": "v3",
		"type.googleapis.com/envoy.config.cluster.v3.Cluster":   "v3",
	}
	xds.Send(messages.XDSState{Upstream: messages.XDSConnected, Address: "127.0.0.1:15010", Since: since,
		LastError: "Unavailable: an old failure", LastACK: acks})
	text, js = getTree(t, f.svc)
	want := "xds upstream: connected to 127.0.0.1:15010 since 2026-03-04T05:06:07Z; last ACK: cds v3, lds v3\n"
	if !strings.HasSuffix(text, want) {
		t.Errorf("connected: the tree does not end with\n%s\ngot:\n%s", want, text)
	}
	if x := js.XDS; x == nil || !x.Reported || x.Upstream != "connected" || x.Address != "127.0.0.1:15010" ||
		!x.Since.Equal(since) || x.LastACK["type.googleapis.com/envoy.config.cluster.v3.Cluster"] != "v3" {
		t.Errorf("connected: xds = %+v", js.XDS)
	}

	xds.Send(messages.XDSState{Upstream: messages.XDSServingCache, Address: "127.0.0.1:15010", Since: since,
		LastError: "Unavailable: connection refused", LastACK: acks})
	text, js = getTree(t, f.svc)
	want = "xds upstream: serving cached configuration, control plane 127.0.0.1:15010 unreachable since " +
		"2026-03-04T05:06:07Z (last error: Unavailable: connection refused); last ACK: cds v3, lds v3\n"
	if !strings.HasSuffix(text, want) {
		t.Errorf("serving the cache: the tree does not end with\n%s\ngot:\n%s", want, text)
	}
	if x := js.XDS; x == nil || x.Upstream != "serving cached configuration" || x.LastError != "Unavailable: connection refused" {
		t.Errorf("serving the cache: xds = %+v", js.XDS)
	}

	xds.Send(messages.XDSState{Upstream: messages.XDSDown, Address: "istiod:15012", Since: since, LastError: "Unauthenticated: bad token"})
	text, _ = getTree(t, f.svc)
	want = "xds upstream: down, control plane istiod:15012 unreachable since 2026-03-04T05:06:07Z, " +
		"no cached configuration to serve (last error: Unauthenticated: bad token)\n"
	if !strings.HasSuffix(text, want) {
		t.Errorf("down: the tree does not end with\n%s\ngot:\n%s", want, text)
	}
}

func TestShortTypeNames(t *testing.T) {
	for typeURL, want := range map[string]string{
		"type.googleapis.com/envoy.config.cluster.v3.Cluster":                  "cds",
		"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment":   "eds",
		"type.googleapis.com/envoy.config.route.v3.RouteConfiguration":         "rds",
		"type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret": "sds",
		"type.googleapis.com/istio.networking.nds.v1.NameTable":                "nds",
		"type.googleapis.com/istio.workload.Address":                           "Address",
	} {
		if got := shortTypeName(typeURL); got != want {
			t.Errorf("shortTypeName(%s) = %q, want %q", typeURL, got, want)
		}
	}
}

// A long health reason keeps both ends in the text view (the cause Go's
// wrapping puts last included), and the JSON view has it whole (#21).
func TestDebugTreeShowsTheWholeHealthReason(t *testing.T) {
	f := newFixture(Config{})
	base := f.serve(t)
	reason := "reading the name table from /var/lib/istio/data/names.json: " + strings.Repeat("retrying, ", 40) +
		"last error: open /var/lib/istio/data/names.json: permission denied"
	f.tree.Send(messages.TreeState{Services: []messages.ServiceInfo{{Name: "dns", Path: "xds/dns", Kind: "service",
		State: messages.Starting, StateName: "starting"}}})
	f.health.Send(messages.Health{Service: "dns", State: messages.Starting, Reason: reason})
	testkit.WaitFor(t, "the tree to show the dns reason", func() bool {
		_, text := get(t, base+"/debug/tree")
		return strings.Contains(text, "reading the name table")
	})
	_, text := get(t, base+"/debug/tree")
	if !strings.Contains(text, "names.json: permission denied") || strings.Contains(text, strings.Repeat("retrying, ", 40)) {
		t.Errorf("the text view's REASON must keep the start and the end of a long reason, cut in the middle:\n%s", text)
	}
	_, body := get(t, base+"/debug/tree?format=json")
	var js struct {
		Services []struct {
			Name         string `json:"name"`
			HealthReason string `json:"health_reason"`
		} `json:"services"`
	}
	if err := json.Unmarshal([]byte(body), &js); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, body)
	}
	if len(js.Services) != 1 || js.Services[0].HealthReason != reason {
		t.Errorf("JSON services = %+v, want dns with its whole health reason", js.Services)
	}
}

// A service that says something of itself while ready (Envoy answering
// the kubelet's probe) keeps its last error beside it: the note must not
// hide why it was restarted (#36).
func TestDebugTreeShowsANoteAndTheLastError(t *testing.T) {
	f := newFixture(Config{})
	base := f.serve(t)
	f.tree.Send(messages.TreeState{Services: []messages.ServiceInfo{{Name: "envoy", Path: "envoy", Kind: "service",
		State: messages.Starting, StateName: "starting", Restarts: 1, LastError: "envoy exited: signal: killed"}}})
	f.health.Send(messages.Health{Service: "envoy", State: messages.Ready, Reason: "envoy answers the probe"})
	testkit.WaitFor(t, "the tree to show the envoy note", func() bool {
		_, text := get(t, base+"/debug/tree")
		return strings.Contains(text, "envoy answers the probe")
	})
	if _, text := get(t, base+"/debug/tree"); !strings.Contains(text, "envoy answers the probe; last error: envoy exited: signal: killed") {
		t.Errorf("the REASON column must hold the note and the last error:\n%s", text)
	}
}

// /debug/xds (and the tree's lines under the upstream) give per type what
// was sent, ACKed and NACKed, and the verdict (issue 22).
func TestDebugXDSShowsVerdictsAndNACKs(t *testing.T) {
	f := newFixture(Config{})
	xds := messages.NewCell[messages.XDSState]()
	f.svc.in.XDS = xds
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	const cds = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	xds.Send(messages.XDSState{Upstream: messages.XDSConnected, Address: "127.0.0.1:15010", Since: at,
		Types: map[string]messages.XDSTypeState{cds: {SentVersion: "v2", SentNonce: "n2", SentResources: 3, SentAt: at,
			ACKedVersion: "v1", NACKs: 1, NACK: &messages.XDSNack{Version: "v2", Nonce: "n2", Error: "cluster c: bad", At: at}}}})

	rec := treeRequest(f.svc, "/debug/xds", "127.0.0.1:1", nil)
	var got XDSReport
	if err := json.Unmarshal(rec.Body.Bytes(), &got); rec.Code != 200 || err != nil {
		t.Fatalf("/debug/xds = %d %v: %s", rec.Code, err, rec.Body)
	}
	if c := got.Types[cds]; c.Short != "cds" || c.Verdict != messages.VerdictNACKed || c.NACK == nil || c.NACK.Error != "cluster c: bad" {
		t.Errorf("/debug/xds cds = %+v", c)
	}
	if rec := treeRequest(f.svc, "/debug/xds", "192.0.2.1:1", nil); rec.Code != 403 {
		t.Errorf("remote /debug/xds = %d; want 403", rec.Code)
	}
	text, _ := getTree(t, f.svc)
	if !strings.Contains(text, "  cds   NACKED        sent v2 (3 resources) at 2026-03-04T05:06:07Z; acked v1; NACK of v2 at 2026-03-04T05:06:07Z: cluster c: bad") {
		t.Errorf("the tree lacks the cds line:\n%s", text)
	}
}
