package appprobe

import (
	"errors"
	"strings"
	"testing"
)

func TestParseAppProbersAcceptsTheInjectorsForm(t *testing.T) {
	probers, err := ParseAppProbers(`{
		"/app-health/web/livez": {"httpGet": {"path": "/hz", "port": 8080, "scheme": "HTTPS", "httpHeaders": [{"name": "X-A", "value": "b"}]}, "timeoutSeconds": 3},
		"/app-health/web/readyz": {"tcpSocket": {"port": 8081}},
		"/app-lifecycle/web/prestopz": {"httpGet": {"path": "stop", "port": 8080}},
		"/app-health/grpc/startupz": {"grpc": {"port": 9090, "service": "db"}, "timeoutSeconds": 1}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	if len(probers) != 4 {
		t.Fatalf("got %d probes, want 4", len(probers))
	}
	live := probers["/app-health/web/livez"]
	if live.HTTPGet == nil || live.HTTPGet.Port != 8080 || live.HTTPGet.Scheme != "HTTPS" || live.timeout().Seconds() != 3 {
		t.Fatalf("livez = %+v", live)
	}
	if r := probers["/app-health/web/readyz"]; r.TCPSocket == nil || r.TCPSocket.Port != 8081 || r.timeout().Seconds() != 1 {
		t.Fatalf("readyz = %+v (timeout 0 must be kubelet's 1s)", r)
	}
	if g := probers["/app-health/grpc/startupz"]; g.GRPC == nil || *g.GRPC.Service != "db" {
		t.Fatalf("startupz = %+v", g)
	}
	for _, empty := range []string{"", "  "} {
		if p, err := ParseAppProbers(empty); err != nil || p != nil {
			t.Fatalf("ParseAppProbers(%q) = %v, %v; want no probes", empty, p, err)
		}
	}
}

// Every refusal names the variable and the probe's path, so that the
// start-up error tells which annotation or container to fix.
func TestParseAppProbersRejectsBadProbes(t *testing.T) {
	for _, tc := range []struct {
		name, json, path, why string
	}{
		{"not JSON", `{"/app-health/a/livez":`, "", "not a JSON object"},
		{"bad path", `{"/healthz/a/livez": {"tcpSocket": {"port": 1}}}`, "/healthz/a/livez", "must match"},
		{"bad probe kind", `{"/app-health/a/deadz": {"tcpSocket": {"port": 1}}}`, "/app-health/a/deadz", "must match"},
		{"two kinds", `{"/app-health/a/livez": {"tcpSocket": {"port": 1}, "grpc": {"port": 2}}}`, "/app-health/a/livez", "exactly one"},
		{"no kind", `{"/app-health/a/livez": {"exec": {"command": ["true"]}}}`, "/app-health/a/livez", "exactly one"},
		{"null probe", `{"/app-health/a/livez": null}`, "/app-health/a/livez", "exactly one"},
		{"named http port", `{"/app-health/a/livez": {"httpGet": {"port": "http"}}}`, "/app-health/a/livez", "named ports"},
		{"named tcp port", `{"/app-health/a/readyz": {"tcpSocket": {"port": "8080"}}}`, "/app-health/a/readyz", "named ports"},
		{"port out of range", `{"/app-health/a/livez": {"tcpSocket": {"port": 70000}}}`, "/app-health/a/livez", "out of range"},
		{"no port", `{"/app-health/a/livez": {"httpGet": {"path": "/"}}}`, "/app-health/a/livez", "out of range"},
		{"bad scheme", `{"/app-health/a/livez": {"httpGet": {"port": 1, "scheme": "FTP"}}}`, "/app-health/a/livez", "scheme"},
		{"negative timeout", `{"/app-health/a/livez": {"tcpSocket": {"port": 1}, "timeoutSeconds": -1}}`, "/app-health/a/livez", "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseAppProbers(tc.json)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrInvalidAppProbe) {
				t.Errorf("error %v does not wrap ErrInvalidAppProbe", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "ISTIO_KUBE_APP_PROBERS") || !strings.Contains(msg, tc.path) || !strings.Contains(msg, tc.why) {
				t.Errorf("error %q must name ISTIO_KUBE_APP_PROBERS, %q and say %q", msg, tc.path, tc.why)
			}
		})
	}
}
