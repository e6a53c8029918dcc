package testkit

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Fetch gives the status and body, or status 0 and why when nothing
// answers; MustFetch passes an answer through.
func TestFetch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write([]byte(r.Method))
	}))
	if code, body := MustFetch(t, http.MethodPost, srv.URL); code != http.StatusTeapot || body != "POST" {
		t.Errorf("MustFetch = %d %q", code, body)
	}
	srv.Close()
	if code, body := Fetch(http.MethodGet, srv.URL); code != 0 || body == "" {
		t.Errorf("Fetch of a closed server = %d %q, want 0 and the error", code, body)
	}
}
