package status

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
)

// treeRequest sends GET path to the server's routes from remote.
func treeRequest(s *Service, path, remote string, header http.Header) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.RemoteAddr = remote
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	s.routes().ServeHTTP(rec, req)
	return rec
}

// /debug/tree names every service, its last error and the control plane:
// loopback callers only, as pprof and /debug/ndsz. A header naming
// loopback is the caller's word, not its address.
func TestDebugTreeIsLoopbackOnly(t *testing.T) {
	f := newFixture(Config{Gatherer: prometheus.NewRegistry()})
	f.tree.Send(messages.TreeState{Services: []messages.ServiceInfo{{Name: "dns", Path: "xds/dns", StateName: "ready"}}})
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
