package status

import (
	"net/http"
	"strings"
	"testing"
)

// GET / lists every endpoint the server answers, whose it is and who may
// call it (issue 22: it was a bare 404); each listed endpoint is served,
// and one listed as loopback-only refuses other callers.
func TestIndexListsEveryEndpoint(t *testing.T) {
	f := newFixtureIn(Config{Chaos: true, Profiling: true},
		Inputs{Debug: map[string]DebugPage{"/debug/crashes": {Handler: http.NotFoundHandler(), Doc: "Envoy's crash records"}}})
	h := f.svc.routes()
	index := treeRequest(f.svc, "/", "192.0.2.10:40000", nil)
	if index.Code != http.StatusOK {
		t.Fatalf("GET / = %d", index.Code)
	}
	lines := strings.Split(index.Body.String(), "\n")
	for _, r := range f.svc.routeTable() {
		if r.doc == "" {
			continue
		}
		var l string
		for _, line := range lines {
			if strings.HasPrefix(line, r.path()+" ") {
				l = line
			}
		}
		if l == "" {
			t.Errorf("GET / does not list %s:\n%s", r.path(), index.Body)
			continue
		}
		if r.loopback != strings.Contains(l, "loopback only") {
			t.Errorf("GET / line %q: loopback-only should be %v", l, r.loopback)
		}
	}
	for _, want := range []string{"/healthz/ready", "/debug/tree", "/debug/crashes", "/drain", "/quitquitquit", "/debug/chaos/kill"} {
		if !strings.Contains(index.Body.String(), want) {
			t.Errorf("GET / lacks %s", want)
		}
	}
	// What the index calls loopback-only is: a remote GET of /debug/tree is refused.
	if rec := request(h, http.MethodGet, "/debug/tree", "192.0.2.10:40000", nil); rec.Code != http.StatusForbidden {
		t.Errorf("remote GET /debug/tree = %d, want 403", rec.Code)
	}
	// Only / itself: an unknown path is still a 404.
	if rec := treeRequest(f.svc, "/no-such-page", "127.0.0.1:1", nil); rec.Code != http.StatusNotFound {
		t.Errorf("GET /no-such-page = %d, want 404", rec.Code)
	}
}
