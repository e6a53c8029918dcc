package main

import (
	"bytes"
	"encoding/json"
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
	addr := statusDocs(t, map[string]string{"/debug/xds": doc})

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

// proxy-status also shows the workload certificate and the DNS name table
// when the agent serves them (issue 22): -o json carries them as
// "certificate" and "names" beside the xDS document.
func TestProxyStatusShowsCertificateAndNameTable(t *testing.T) {
	docs := map[string]string{
		"/debug/xds": `{"reported":true,"upstream":"connected","address":"istiod:15012","types":{}}`,
		"/debug/certs": `{"reported":true,"sans":["spiffe://cluster.local/ns/default/sa/default"],"serial":"3b88",
		  "not_before":"2026-11-26T12:00:00Z","not_after":"2026-11-27T12:00:00Z","remaining_seconds":3600,"renew_at":"2026-11-27T00:00:00Z",
		  "root_sha256":["AB:CD"]}`,
		"/debug/names": `{"reported":true,"version":"v7","names":12,"source":"NDS"}`,
	}
	addr := statusDocs(t, docs)

	var out, errOut bytes.Buffer
	if code := execute(&cliContext{args: []string{"proxy-status", "--addr", addr}, stdout: &out, stderr: &errOut}); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{
		"CERTIFICATE: spiffe://cluster.local/ns/default/sa/default serial 3b88 valid 2026-11-26T12:00:00Z to 2026-11-27T12:00:00Z (1h0m0s left)",
		"NEXT RENEWAL: 2026-11-27T00:00:00Z", "ROOT SHA-256: AB:CD", "DNS TABLE: 12 names, version v7, from NDS"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("%q missing from:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := execute(&cliContext{args: []string{"proxy-status", "--addr", addr, "-o", "json"}, stdout: &out, stderr: &errOut}); code != 0 {
		t.Fatalf("-o json: exit %d: %s", code, errOut.String())
	}
	var doc struct {
		Upstream    string
		Certificate struct{ Serial string }
		Names       struct{ Names int }
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil || doc.Upstream != "connected" || doc.Certificate.Serial != "3b88" || doc.Names.Names != 12 {
		t.Errorf("-o json: %v %+v\n%s", err, doc, out.String())
	}
}

// statusDocs is a status server that answers these paths with these
// documents (404 for any other); it returns its host:port.
func statusDocs(t *testing.T, docs map[string]string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		doc, ok := docs[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(doc))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}
