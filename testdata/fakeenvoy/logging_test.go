package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// POST /logging as Envoy answers it (#35): the levels of the command
// line, changed all at once, one by one or by paths; a bad level or name
// is a 404 changing nothing; a GET is refused.
func TestLogging(t *testing.T) {
	e := heldEnvoy(t)
	e.opts = &options{logLevel: "warning", componentLogLevel: "misc:error"}
	post := func(query string) (int, string) {
		rec := httptest.NewRecorder()
		e.handleLogging(rec, httptest.NewRequest(http.MethodPost, "/logging"+query, nil))
		return rec.Code, rec.Body.String()
	}
	code, body := post("")
	if code != 200 || !strings.HasPrefix(body, "active loggers:\n") || !strings.Contains(body, "  http: warning\n") || !strings.Contains(body, "  misc: error\n") {
		t.Fatalf("POST /logging = %d:\n%s", code, body)
	}
	if _, body = post("?level=debug"); !strings.Contains(body, "  http: debug\n") || !strings.Contains(body, "  misc: debug\n") {
		t.Errorf("?level=debug:\n%s", body)
	}
	if _, body = post("?http=trace"); !strings.Contains(body, "  http: trace\n") || !strings.Contains(body, "  router: debug\n") {
		t.Errorf("?http=trace:\n%s", body)
	}
	if _, body = post("?paths=router:error,grpc:off"); !strings.Contains(body, "  router: error\n") || !strings.Contains(body, "  grpc: off\n") {
		t.Errorf("?paths=router:error,grpc:off:\n%s", body)
	}
	for _, bad := range []string{"?level=loud", "?nosuchlogger=info", "?http=loud", "?http=info&router=info"} {
		code, body := post(bad)
		if code != http.StatusNotFound || !strings.HasPrefix(body, "error: ") || !strings.Contains(body, "  http: trace\n") {
			t.Errorf("%s = %d:\n%s\nwant 404 with the error, nothing changed", bad, code, body)
		}
	}
	rec := httptest.NewRecorder()
	e.handleLogging(rec, httptest.NewRequest(http.MethodGet, "/logging?level=debug", nil))
	if rec.Code != http.StatusMethodNotAllowed || !strings.Contains(rec.Body.String(), "POST required") {
		t.Errorf("GET /logging = %d %q; want Envoy's 405", rec.Code, rec.Body.String())
	}
}
