package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// proxy-status prints the status server's /debug/xds as a table: the
// control plane, then per type the verdict and Envoy's error (issue 22);
// -o json passes the document through; no agent is a clear error.
func TestProxyStatusCommand(t *testing.T) {
	doc := `{"reported":true,"upstream":"connected","address":"istiod.istio-system.svc:15012",
	  "types":{"type.googleapis.com/envoy.config.cluster.v3.Cluster":{"short":"cds","verdict":"NACKED",
	    "sent_version":"v2","sent_resources":1,"sent_at":"2026-11-26T12:00:00Z","acked_version":"v1","nacks":1,
	    "nack":{"version":"v2","error":"cluster outbound|80||a: bad\nsecond line","at":"2026-11-26T12:00:01Z"}},
	   "type.googleapis.com/envoy.config.listener.v3.Listener":{"short":"lds","verdict":"SYNCED",
	    "sent_version":"v1","sent_resources":4,"sent_at":"2026-11-26T12:00:00Z","acked_version":"v1"}}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/xds" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(doc))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	var out, errOut bytes.Buffer
	if code := execute(&cliContext{args: []string{"proxy-status", "--addr", addr}, stdout: &out, stderr: &errOut}); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	text := out.String()
	for _, want := range []string{"CONTROL PLANE: connected istiod.istio-system.svc:15012", "cds", "NACKED",
		"(v2 at 2026-11-26T12:00:01Z) cluster outbound|80||a: bad second line", "lds", "SYNCED"} {
		if !strings.Contains(text, want) {
			t.Errorf("%q missing from:\n%s", want, text)
		}
	}
	out.Reset()
	if code := execute(&cliContext{args: []string{"proxy-status", "--addr", addr, "-o", "json"}, stdout: &out, stderr: &errOut}); code != 0 || out.String() != doc {
		t.Errorf("-o json: exit %d, %q", code, out.String())
	}
	errOut.Reset()
	if code := execute(&cliContext{args: []string{"proxy-status", "--addr", "127.0.0.1:1"}, stdout: &out, stderr: &errOut}); code == 0 ||
		!strings.Contains(errOut.String(), "is the agent running") {
		t.Errorf("no agent: exit %d, %q", code, errOut.String())
	}
}
