package status

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/status/appprobe"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// workloadFixture runs the status service with a workload probe and records
// what it sends.
func workloadFixture(t *testing.T, wp *appprobe.WorkloadProbe, requireEnvoy bool) (*fixture, *messages.Stream[messages.WorkloadHealth]) {
	t.Helper()
	sent := messages.NewStream[messages.WorkloadHealth](0, nil)
	f := newFixtureIn(Config{Probes: appprobe.Config{Host: "127.0.0.1", Workload: wp}}, Inputs{RequireEnvoy: requireEnvoy})
	f.svc.out.WorkloadHealth = sent
	f.serve(t)
	return f, sent
}

// nextHealth waits for the next WorkloadHealth sent.
func nextHealth(t *testing.T, sent *messages.Stream[messages.WorkloadHealth], pending *[]messages.WorkloadHealth) messages.WorkloadHealth {
	t.Helper()
	for len(*pending) == 0 {
		select {
		case <-sent.Ready():
			*pending = append(*pending, sent.Take()...)
		case <-time.After(20 * time.Second):
			t.Fatal("no WorkloadHealth sent")
		}
	}
	h := (*pending)[0]
	*pending = (*pending)[1:]
	return h
}

// An HTTP workload probe sends a verdict when it changes, and only then;
// a change needs FailureThreshold failures in a row.
func TestWorkloadProbeHTTPSendsTransitions(t *testing.T) {
	var failing atomic.Bool
	var probes, failuresServed atomic.Int32
	var userAgent, custom atomic.Value
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		probes.Add(1)
		userAgent.Store(r.UserAgent())
		custom.Store(r.Header.Get("X-Check"))
		if failing.Load() {
			failuresServed.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer app.Close()
	wp := &appprobe.WorkloadProbe{
		HTTPGet: &appprobe.HTTPGetAction{Path: "/ready", Port: appprobe.ProbePort(portOf(t, app.URL)), HTTPHeaders: []appprobe.HTTPHeader{{Name: "X-Check", Value: "vm"}}},
		Period:  10 * time.Millisecond, Timeout: 5 * time.Second, SuccessThreshold: 1, FailureThreshold: 3,
	}
	_, sent := workloadFixture(t, wp, false)
	var pending []messages.WorkloadHealth
	if h := nextHealth(t, sent, &pending); !h.Healthy {
		t.Fatalf("first verdict %+v, want healthy", h)
	}
	if ua, _ := userAgent.Load().(string); ua != "istio-probe/1.0" {
		t.Errorf("User-Agent %q, want Istio's istio-probe/1.0", ua)
	}
	if c, _ := custom.Load().(string); c != "vm" {
		t.Errorf("the probe's header X-Check = %q", c)
	}
	failing.Store(true)
	h := nextHealth(t, sent, &pending)
	if h.Healthy || !strings.Contains(h.Reason, "503") || !strings.Contains(h.Reason, "/ready") {
		t.Fatalf("verdict after failures %+v, want unhealthy with the status and URL", h)
	}
	if n := failuresServed.Load(); n < 3 {
		t.Fatalf("unhealthy after %d failed probes, want FailureThreshold 3", n)
	}
	failing.Store(false)
	if h := nextHealth(t, sent, &pending); !h.Healthy {
		t.Fatalf("verdict after recovery %+v", h)
	}
	// Healthy probes go on and send nothing more.
	deadline := time.Now().Add(20 * time.Second)
	for seen := probes.Load(); probes.Load() < seen+5; {
		if time.Now().After(deadline) {
			t.Fatal("probes stopped")
		}
		select {
		case <-sent.Ready():
			t.Fatalf("a verdict was sent without a change: %+v", sent.Take())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestWorkloadProbeTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := portOf(t, ln.Addr().String())
	testkit.AcceptAndClose(t, ln)
	_, sent := workloadFixture(t, &appprobe.WorkloadProbe{
		TCPSocket: &appprobe.TCPSocketAction{Port: appprobe.ProbePort(port)},
		Period:    10 * time.Millisecond, Timeout: time.Second, SuccessThreshold: 1, FailureThreshold: 1,
	}, false)
	var pending []messages.WorkloadHealth
	if h := nextHealth(t, sent, &pending); !h.Healthy {
		t.Fatalf("listening port: %+v", h)
	}
	ln.Close()
	if h := nextHealth(t, sent, &pending); h.Healthy || !strings.Contains(h.Reason, "refused") {
		t.Fatalf("closed port: %+v, want unhealthy (connection refused)", h)
	}
}

// exec runs the command without a shell; a non-zero exit or the timeout is
// unhealthy.
func TestWorkloadProbeExec(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ready")
	_, sent := workloadFixture(t, &appprobe.WorkloadProbe{
		Exec:   []string{"test", "-f", marker},
		Period: 10 * time.Millisecond, Timeout: 5 * time.Second, SuccessThreshold: 2, FailureThreshold: 1,
	}, false)
	var pending []messages.WorkloadHealth
	if h := nextHealth(t, sent, &pending); h.Healthy || !strings.Contains(h.Reason, "exit status 1") {
		t.Fatalf("without the file: %+v", h)
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if h := nextHealth(t, sent, &pending); !h.Healthy {
		t.Fatalf("with the file: %+v", h)
	}
}

func TestWorkloadProbeExecTimesOut(t *testing.T) {
	_, sent := workloadFixture(t, &appprobe.WorkloadProbe{
		Exec:   []string{"sleep", "30"},
		Period: 10 * time.Millisecond, Timeout: 100 * time.Millisecond, SuccessThreshold: 1, FailureThreshold: 1,
	}, false)
	var pending []messages.WorkloadHealth
	if h := nextHealth(t, sent, &pending); h.Healthy || !strings.Contains(h.Reason, "timed out") {
		t.Fatalf("a command that hangs: %+v, want unhealthy (timed out)", h)
	}
}

// With an Envoy, the workload is healthy only once Envoy is ready, as
// Istio checks Envoy before the application.
func TestWorkloadProbeWaitsForEnvoy(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer app.Close()
	f, sent := workloadFixture(t, &appprobe.WorkloadProbe{
		HTTPGet: &appprobe.HTTPGetAction{Path: "/", Port: appprobe.ProbePort(portOf(t, app.URL))},
		Period:  10 * time.Millisecond, Timeout: time.Second, SuccessThreshold: 1, FailureThreshold: 1,
	}, true)
	var pending []messages.WorkloadHealth
	f.envoy.Send(messages.EnvoyState{Phase: messages.EnvoyRunning})
	if h := nextHealth(t, sent, &pending); h.Healthy || !strings.Contains(h.Reason, "envoy") {
		t.Fatalf("Envoy not ready: %+v", h)
	}
	f.envoy.Send(messages.EnvoyState{Phase: messages.EnvoyReady})
	if h := nextHealth(t, sent, &pending); !h.Healthy {
		t.Fatalf("Envoy ready, application up: %+v", h)
	}
	f.envoy.Send(messages.EnvoyState{Phase: messages.EnvoyDraining})
	if h := nextHealth(t, sent, &pending); h.Healthy || !strings.Contains(h.Reason, fmt.Sprint(messages.EnvoyDraining)) {
		t.Fatalf("Envoy draining: %+v", h)
	}
}
