package appprobe

import (
	"errors"
	"strings"
	"testing"
)

// The variable the injector fills from the pod's probes is read at start;
// whatever it holds, the parser must answer with probes that hold
// together, or an error that names the variable, never a panic (#21).
// `make fuzz` runs this for longer (hack/fuzz.sh).

// FuzzParseAppProbers: ISTIO_KUBE_APP_PROBERS.
func FuzzParseAppProbers(f *testing.F) {
	for _, seed := range []string{
		`{"/app-health/web/livez": {"httpGet": {"path": "/hz", "port": 8080, "scheme": "HTTPS", "httpHeaders": [{"name": "X-A", "value": "b"}]}, "timeoutSeconds": 3}}`,
		`{"/app-health/web/readyz": {"tcpSocket": {"port": 8081}}}`,
		`{"/app-lifecycle/web/prestopz": {"httpGet": {"path": "stop", "port": 8080}}}`,
		`{"/app-health/grpc/startupz": {"grpc": {"port": 9090, "service": "db"}, "timeoutSeconds": 1}}`,
		`{"/app-health/a/livez": {"tcpSocket": {"port": 1}, "grpc": {"port": 2}}}`,
		`{"/app-health/a/livez": null}`,
		`{"/app-health/a/livez": {"httpGet": {"port": "http"}}}`,
		`{"/app-health/a/livez":`,
		``,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		probers, err := ParseAppProbers(value)
		if err != nil {
			if !errors.Is(err, ErrInvalidAppProbe) || !strings.HasPrefix(err.Error(), AppProbersEnv+": ") {
				t.Fatalf("error %q: want one naming %s and wrapping ErrInvalidAppProbe", err, AppProbersEnv)
			}
			return
		}
		for path, p := range probers {
			if !appProbePath().MatchString(path) {
				t.Fatalf("accepted a probe at %q", path)
			}
			kinds := 0
			for _, set := range []bool{p.HTTPGet != nil, p.TCPSocket != nil, p.GRPC != nil} {
				if set {
					kinds++
				}
			}
			if kinds != 1 || p.TimeoutSeconds < 0 {
				t.Fatalf("accepted probe %q: %+v", path, p)
			}
		}
	})
}
