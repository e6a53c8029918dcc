package status

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/meshagent/meshagent/services/status/appprobe"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// stuckApp accepts connections and never reads or answers: the slow
// application. The requests forwarded to it sit in the kernel's buffers,
// not in the test's heap.
type stuckApp struct {
	ln       net.Listener
	accepted atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
}

func newStuckApp(t *testing.T) *stuckApp {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &stuckApp{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.mu.Lock()
			a.conns = append(a.conns, c)
			a.mu.Unlock()
			a.accepted.Add(1)
		}
	}()
	t.Cleanup(a.close)
	return a
}

// close ends every connection: the probes waiting on them fail at once.
func (a *stuckApp) close() {
	a.ln.Close()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.conns {
		c.Close()
	}
	a.conns = nil
}

// rawRequest is a probe request with n headers of size bytes each.
func rawRequest(path string, n, size int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kube-probe/1.34\r\n", path)
	value := strings.Repeat("v", size)
	for i := range n {
		fmt.Fprintf(&b, "X-Big-%d: %s\r\n", i, value)
	}
	b.WriteString("\r\n")
	return b.Bytes()
}

// Many concurrent probes from off the pod, with large headers or without,
// in front of an application that never answers (#33: 2,000 requests of
// 16 headers of 60 KiB took the agent from 39 MiB to 1.28 GB and it
// stayed there): the headers past the bound are refused (431), the
// probes past the probe class's bound get 503 at once, and the agent's
// heap, with every request either answered or held by the application,
// stays within a few MiB, not the hundreds the requests carry.
func TestStatusServerBoundsConcurrentLargeRequests(t *testing.T) {
	app := newStuckApp(t)
	port := portOf(t, app.ln.Addr().String())
	json := fmt.Sprintf(`{"/app-health/app/livez": {"httpGet": {"path": "/slow", "port": %d}, "timeoutSeconds": 600}}`, port)
	f := newFixture(Config{Probes: appprobe.Config{Host: "127.0.0.1", App: probers(t, json)}})
	base := f.serve(t)
	addr := strings.TrimPrefix(base, "http://")

	big := rawRequest("/app-health/app/livez", 16, 60<<10) // 960 KiB: under Go's default 1 MiB
	small := rawRequest("/app-health/app/livez", 2, 1<<10)
	const each = 150
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	var answered atomic.Int64
	codes := map[string]int{}
	var mu sync.Mutex
	conns := make(chan net.Conn, 2*each)
	for i := range 2 * each {
		req := small
		if i%2 == 0 {
			req = big
		}
		go func() {
			status := "connection ended"
			defer func() {
				mu.Lock()
				codes[status]++
				mu.Unlock()
				answered.Add(1)
			}()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				status = "dial: " + err.Error()
				return
			}
			conns <- c
			_, _ = c.Write(req) // cut short by a 431 and a close: fine
			line, err := bufio.NewReaderSize(c, 512).ReadString('\n')
			if err == nil {
				status = strings.TrimSpace(line)
			}
		}()
	}
	t.Cleanup(func() {
		app.close()
		for range 2 * each {
			(<-conns).Close()
		}
	})
	testkit.WaitFor(t, "every request answered or held by the application", func() bool {
		return answered.Load()+app.accepted.Load() >= 2*each
	})
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	mu.Lock()
	t.Logf("held by the app: %d; answers: %v; heap grown by %d KiB", app.accepted.Load(), codes, grown>>10)
	mu.Unlock()
	if held := app.accepted.Load(); held > int64(classProbes.max) {
		t.Errorf("%d probes reached the application at once, more than the bound %d", held, classProbes.max)
	}
	if grown > 32<<20 {
		t.Errorf("the heap grew by %d MiB with %d requests in flight (%d of %d KiB headers)", grown>>20, 2*each, each, len(big)>>10)
	}
	mu.Lock()
	defer mu.Unlock()
	if codes["HTTP/1.1 503 Service Unavailable"] == 0 {
		t.Errorf("no probe past the bound got 503: %v", codes)
	}
}

// Requests of a class beyond its bound get 503 naming the bound; other
// classes are still served.
func TestLimiterAnswers503PastTheBound(t *testing.T) {
	l := newLimiter()
	for range classMetrics.max {
		l[classMetrics] <- struct{}{}
	}
	ok := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }
	w := postFromLoopback(l.wrap("GET /metrics", ok), "/metrics")
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "4 metrics requests already in progress (the bound)") {
		t.Fatalf("a fifth metrics request: %d %q", w.Code, w.Body.String())
	}
	if w := postFromLoopback(l.wrap("GET /healthz/ready", ok), "/healthz/ready"); w.Code != http.StatusOK {
		t.Fatalf("readiness with the metrics class full: %d", w.Code)
	}
}
