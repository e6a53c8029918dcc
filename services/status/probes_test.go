package status

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/services/status/appprobe"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// newLoggedFixture is newFixture with a log the test can read.
func newLoggedFixture(cfg Config, log *slog.Logger) *fixture {
	f := newFixtureIn(Config{}, Inputs{Metrics: prometheus.NewRegistry()}) // its channels
	in := f.svc.in
	in.Metrics = f.reg
	f.svc = mustNew(cfg, in, f.svc.out, log)
	return f
}

// infoLogger logs at Info into w: the tests count lines that a Debug
// line could repeat.
func infoLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// probers builds ISTIO_KUBE_APP_PROBERS the way the injector would.
func probers(t *testing.T, json string) appprobe.AppProbers {
	t.Helper()
	p, err := appprobe.ParseAppProbers(json)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// portOf is the port of an httptest server or a listener address.
func portOf(t testing.TB, addr string) int {
	t.Helper()
	if u, ok := strings.CutPrefix(addr, "http://"); ok {
		addr = u
	} else if u, ok := strings.CutPrefix(addr, "https://"); ok {
		addr = u
	}
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := portOf(t, ln.Addr().String())
	ln.Close()
	return port
}

// getWithHeader is a GET with header (nil for none): its status and body.
func getWithHeader(t *testing.T, url string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if header != nil {
		req.Header = header
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The application as kubelet would see it through the agent: status and
// body copied (at most 10 KiB), kubelet's headers passed on, Host moved to
// the application's port, kubelet's redirect rules.
func TestAppProbeHTTP(t *testing.T) {
	var otherHostHits atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { otherHostHits.Add(1) }))
	defer other.Close()
	otherURL := strings.Replace(other.URL, "127.0.0.1", "localhost", 1) // another host name, same machine

	var seenHost, seenHeader atomic.Value
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			seenHost.Store(r.Host)
			seenHeader.Store(r.Header.Get("X-Kubelet-Header"))
			fmt.Fprint(w, "fine")
		case "/fail":
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, "database down")
		case "/big":
			fmt.Fprint(w, strings.Repeat("x", 20<<10))
		case "/same-host":
			http.Redirect(w, r, "/fail", http.StatusFound)
		case "/other-host":
			http.Redirect(w, r, otherURL+"/anything", http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		case "/no-location":
			w.WriteHeader(http.StatusFound)
		}
	}))
	defer app.Close()
	port := portOf(t, app.URL)
	json := "{"
	for i, path := range []string{"ok", "fail", "big", "same-host", "other-host", "loop", "no-location"} {
		if i > 0 {
			json += ","
		}
		json += fmt.Sprintf(`"/app-health/%s/livez": {"httpGet": {"path": "/%s", "port": %d}, "timeoutSeconds": 10}`, path, path, port)
	}
	f := newFixture(Config{Probes: appprobe.Config{Host: "127.0.0.1", App: probers(t, json+"}")}})
	base := f.serve(t)

	code, body := getWithHeader(t, base+"/app-health/ok/livez", http.Header{"X-Kubelet-Header": {"kube-probe"}})
	if code != 200 || body != "fine" {
		t.Fatalf("ok: %d %q", code, body)
	}
	if got, want := seenHost.Load(), "127.0.0.1:"+strconv.Itoa(port); got != want {
		t.Errorf("application saw Host %v, want %s (kubelet's Host, the status port replaced)", got, want)
	}
	if got := seenHeader.Load(); got != "kube-probe" {
		t.Errorf("application saw X-Kubelet-Header %q, want kubelet's value", got)
	}
	for path, want := range map[string]struct {
		code int
		body string
	}{
		"fail":        {503, "database down"},
		"big":         {200, strings.Repeat("x", 10<<10)},
		"same-host":   {503, "database down"}, // followed
		"other-host":  {200, ""},              // not followed: success
		"loop":        {500, ""},              // more than 10 redirects
		"no-location": {200, ""},              // a 3xx is success
	} {
		code, body := get(t, base+"/app-health/"+path+"/livez")
		if code != want.code || body != want.body {
			t.Errorf("%s: %d %.40q (%d bytes), want %d %.40q (%d bytes)", path, code, body, len(body), want.code, want.body, len(want.body))
		}
	}
	if n := otherHostHits.Load(); n != 0 {
		t.Errorf("a redirect to another host was followed (%d requests there)", n)
	}
	for _, path := range []string{"/app-health/nope/livez", "/app-health/ok/deadz", "/app-health/"} {
		if code, _ := get(t, base+path); code != http.StatusBadRequest {
			t.Errorf("%s = %d, want 400", path, code)
		}
	}
}

// HTTPS probes skip certificate verification and use HTTP/2 unless
// ISTIO_ENABLE_HTTP2_PROBING=false, as kubelet's.
func TestAppProbeHTTPSAndHTTP2(t *testing.T) {
	var proto atomic.Int32
	app := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto.Store(int32(r.ProtoMajor))
	}))
	app.EnableHTTP2 = true
	app.StartTLS() // a certificate no client trusts
	defer app.Close()
	json := fmt.Sprintf(`{"/app-health/web/readyz": {"httpGet": {"path": "/", "port": %d, "scheme": "HTTPS"}}}`, portOf(t, app.URL))
	for _, tc := range []struct {
		disable bool
		want    int32
	}{{false, 2}, {true, 1}} {
		f := newFixture(Config{Probes: appprobe.Config{Host: "127.0.0.1", App: probers(t, json), DisableHTTP2: tc.disable}})
		base := f.serve(t)
		if code, body := get(t, base+"/app-health/web/readyz"); code != 200 {
			t.Fatalf("https probe (DisableHTTP2=%v) = %d %q", tc.disable, code, body)
		}
		if got := proto.Load(); got != tc.want {
			t.Errorf("DisableHTTP2=%v: application saw HTTP/%d, want HTTP/%d", tc.disable, got, tc.want)
		}
	}
}

// Each probe opens its own connection unless
// ENABLE_PROBE_KEEPALIVE_CONNECTIONS=true.
func TestAppProbeKeepAlive(t *testing.T) {
	var conns atomic.Int32
	app := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	app.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	app.Start()
	defer app.Close()
	json := fmt.Sprintf(`{"/app-health/web/livez": {"httpGet": {"port": %d}}}`, portOf(t, app.URL))
	for _, tc := range []struct {
		keepAlive bool
		want      int32
	}{{false, 3}, {true, 1}} {
		conns.Store(0)
		f := newFixture(Config{Probes: appprobe.Config{Host: "127.0.0.1", App: probers(t, json), KeepAlive: tc.keepAlive}})
		base := f.serve(t)
		for range 3 {
			if code, _ := get(t, base+"/app-health/web/livez"); code != 200 {
				t.Fatalf("probe = %d", code)
			}
		}
		if got := conns.Load(); got != tc.want {
			t.Errorf("KeepAlive=%v: 3 probes opened %d connections, want %d", tc.keepAlive, got, tc.want)
		}
	}
}

func TestAppProbeTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testkit.AcceptAndClose(t, ln)
	f := newFixture(Config{Probes: appprobe.Config{Host: "127.0.0.1", App: probers(t, fmt.Sprintf(`{
		"/app-health/up/livez": {"tcpSocket": {"port": %d}},
		"/app-health/down/livez": {"tcpSocket": {"port": %d}}}`, portOf(t, ln.Addr().String()), closedPort(t)))}})
	base := f.serve(t)
	if code, _ := get(t, base+"/app-health/up/livez"); code != 200 {
		t.Errorf("listening port = %d, want 200", code)
	}
	if code, _ := get(t, base+"/app-health/down/livez"); code != 500 {
		t.Errorf("closed port = %d, want 500", code)
	}
}

// startHealthServer serves grpc.health.v1 on loopback: "" and "db"
// SERVING, "cache" NOT_SERVING.
func startHealthServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("db", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("cache", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return portOf(t, ln.Addr().String())
}

func TestAppProbeGRPC(t *testing.T) {
	port := startHealthServer(t)
	f := newFixture(Config{Probes: appprobe.Config{Host: "127.0.0.1", App: probers(t, fmt.Sprintf(`{
		"/app-health/all/livez": {"grpc": {"port": %[1]d}},
		"/app-health/db/livez": {"grpc": {"port": %[1]d, "service": "db"}},
		"/app-health/cache/livez": {"grpc": {"port": %[1]d, "service": "cache"}},
		"/app-health/unknown/livez": {"grpc": {"port": %[1]d, "service": "unknown"}},
		"/app-health/down/livez": {"grpc": {"port": %[2]d}}}`, port, closedPort(t)))}})
	base := f.serve(t)
	for path, want := range map[string]int{"all": 200, "db": 200, "cache": 500, "unknown": 500, "down": 500} {
		if code, _ := get(t, base+"/app-health/"+path+"/livez"); code != want {
			t.Errorf("%s = %d, want %d", path, code, want)
		}
	}
}

// A probe of an application that does not answer holds only its own
// request: the status server and other probes answer meanwhile.
func TestSlowApplicationBlocksOnlyItsProbe(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(arrived)
			select {
			case <-release:
			case <-time.After(20 * time.Second):
			}
		}
	}))
	defer app.Close()
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock() // before app.Close, if the test fails early
	port := portOf(t, app.URL)
	f := newFixture(Config{Probes: appprobe.Config{Host: "127.0.0.1", App: probers(t, fmt.Sprintf(`{
		"/app-health/slow/livez": {"httpGet": {"path": "/slow", "port": %[1]d}, "timeoutSeconds": 30},
		"/app-health/fast/livez": {"httpGet": {"path": "/fast", "port": %[1]d}, "timeoutSeconds": 30}}`, port))}})
	base := f.serve(t)

	slow := make(chan int, 1)
	go func() {
		resp, err := client.Get(base + "/app-health/slow/livez")
		if err != nil {
			slow <- -1
			return
		}
		resp.Body.Close()
		slow <- resp.StatusCode
	}()
	<-arrived
	for range 5 {
		if code, _ := get(t, base+"/app-health/fast/livez"); code != 200 {
			t.Fatalf("fast probe while the slow one waits = %d", code)
		}
		if code, _ := get(t, base+"/healthz/ready"); code != 200 {
			t.Fatalf("/healthz/ready while a probe waits = %d", code)
		}
	}
	select {
	case code := <-slow:
		t.Fatalf("the slow probe ended (%d) before its application answered", code)
	default:
	}
	unblock()
	if code := <-slow; code != 200 {
		t.Fatalf("slow probe = %d after the application answered", code)
	}
}

// The probe gives up at the probe's timeoutSeconds: kubelet gets 500 and
// the application's request is cancelled.
func TestAppProbeTimesOut(t *testing.T) {
	cancelled := make(chan bool, 1)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			cancelled <- true
		case <-time.After(20 * time.Second):
			cancelled <- false
		}
	}))
	defer app.Close()
	f := newFixture(Config{Probes: appprobe.Config{Host: "127.0.0.1", App: probers(t, fmt.Sprintf(
		`{"/app-health/web/livez": {"httpGet": {"path": "/", "port": %d}, "timeoutSeconds": 1}}`, portOf(t, app.URL)))}})
	base := f.serve(t)
	if code, _ := get(t, base+"/app-health/web/livez"); code != 500 {
		t.Fatalf("probe of a hung application = %d, want 500", code)
	}
	if !<-cancelled {
		t.Fatal("the application's request was not cancelled by the probe's timeout")
	}
}

// Probes come from 127.0.0.6, the address Istio's capture rules let
// through to the application.
func TestAppProbeComesFrom127006(t *testing.T) {
	if ln, err := net.Listen("tcp", "127.0.0.6:0"); err != nil {
		t.Skipf("127.0.0.6 cannot be bound here (%v); nothing to check", err)
	} else {
		ln.Close()
	}
	var peer atomic.Value
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer.Store(r.RemoteAddr)
	}))
	defer app.Close()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	tcpPeer := make(chan string, 1)
	go func() {
		c, err := tcp.Accept()
		if err != nil {
			return
		}
		tcpPeer <- c.RemoteAddr().String()
		c.Close()
	}()
	f := newFixture(Config{Probes: appprobe.Config{Host: "127.0.0.1", App: probers(t, fmt.Sprintf(`{
		"/app-health/web/livez": {"httpGet": {"port": %d}},
		"/app-health/web/readyz": {"tcpSocket": {"port": %d}}}`, portOf(t, app.URL), portOf(t, tcp.Addr().String())))}})
	base := f.serve(t)
	if code, _ := get(t, base+"/app-health/web/livez"); code != 200 {
		t.Fatalf("http probe = %d", code)
	}
	if p, _ := peer.Load().(string); !strings.HasPrefix(p, "127.0.0.6:") {
		t.Errorf("http probe came from %q, want 127.0.0.6", p)
	}
	if code, _ := get(t, base+"/app-health/web/readyz"); code != 200 {
		t.Fatalf("tcp probe = %d", code)
	}
	if p := <-tcpPeer; !strings.HasPrefix(p, "127.0.0.6:") {
		t.Errorf("tcp probe came from %q, want 127.0.0.6", p)
	}
}

// Where ::6 is not on lo (anywhere outside a pod), an IPv6 probe still goes
// out, from the default address, and the log says so once.
func TestAppProbeFallsBackWhenSourceCannotBeBound(t *testing.T) {
	app, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here (%v)", err)
	}
	defer app.Close()
	if ln, err := net.Listen("tcp", "[::6]:0"); err == nil {
		ln.Close()
		t.Skip("::6 can be bound here: no fallback to see")
	}
	testkit.AcceptAndClose(t, app)
	var logs testkit.LogBuffer
	f := newLoggedFixture(Config{Probes: appprobe.Config{Host: "::1", App: probers(t, fmt.Sprintf(
		`{"/app-health/web/livez": {"tcpSocket": {"port": %d}}}`, portOf(t, app.Addr().String())))}}, infoLogger(&logs))
	base := f.serve(t)
	for range 3 {
		if code, _ := get(t, base+"/app-health/web/livez"); code != 200 {
			t.Fatalf("probe to [::1] = %d, want 200 from the default source address", code)
		}
	}
	if n := strings.Count(logs.String(), "cannot send application probes from the capture-exempt source address"); n != 1 {
		t.Fatalf("fallback logged %d times, want once:\n%s", n, logs.String())
	}
}
