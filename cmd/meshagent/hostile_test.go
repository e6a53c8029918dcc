package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/e2ekit"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// hostileServer serves, on every port the CLI calls (Envoy's admin,
// the status ports), inside the network namespace ns, either an endless
// 200 body or a 500 with a 10 MiB body.
func hostileServer(t *testing.T, ns string) {
	t.Helper()
	lns := make(chan []net.Listener, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in ns
		f, err := os.Open(ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		var ls []net.Listener
		for _, port := range []int{15000, 15020, 15021} {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				errc <- err
				return
			}
			ls = append(ls, ln)
		}
		lns <- ls
	}()
	var ls []net.Listener
	select {
	case err := <-errc:
		t.Fatal(err)
	case ls = <-lns:
	}
	zeros := bytes.Repeat([]byte("0"), 64<<10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "fail") || r.URL.Path == "/healthz/ready" {
			w.WriteHeader(http.StatusInternalServerError)
			for range 160 { // 10 MiB
				if _, err := w.Write(zeros); err != nil {
					return
				}
			}
			return
		}
		for { // endless
			if _, err := w.Write(zeros); err != nil {
				return
			}
		}
	})
	for _, ln := range ls {
		srv := &http.Server{Handler: h}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
	}
}

// The CLI as a client of a hostile server (#33): `request` (the preStop
// hook's command) was OOM-killed in 2-3 s against an endless body and
// printed a 500's 10 MiB body whole; proxy-config and proxy-status cut a
// large answer silently ("proto: unexpected EOF") after reading 256 MiB.
// Each command now stays under ~64 MiB more than its own start whatever
// the server sends, and says the answer was cut, at which bound.
func TestCLIAgainstAHostileServer(t *testing.T) {
	testkit.RequireRoot(t, "serves on the pod's ports in a namespace of its own", "unshare", "nsenter", "ip")
	ns := podNetns(t)
	hostileServer(t, ns)
	// The command's own start, measured the same way: its binary's pages
	// and the runtime's, which the page cache and the machine move by a
	// few MiB from run to run; what a hostile answer can add is on top.
	_, start, _ := runMeasured(t, ns, "version", "-s")
	t.Logf("the CLI's own start peaks at %d MiB", start>>20)
	for _, tc := range []struct {
		name string
		args []string
		want []string
		// bound is what the command may hold of an answer: the bound it
		// names, or a chunk when it streams or quotes an excerpt.
		bound int64
	}{
		{"request, endless", []string{"request", "GET", "/stats"}, []string{"answer cut at 1024 MiB (the bound)"}, 1 << 20},
		{"request, 10 MiB 500", []string{"request", "POST", "/fail"}, []string{"500 Internal Server Error", "answer cut at its first 1024 bytes"}, 1 << 20},
		{"proxy-config, endless", []string{"proxy-config", "clusters"}, []string{"answer cut at 64 MiB (the bound)"}, 64 << 20},
		{"proxy-status, endless", []string{"proxy-status"}, []string{"answer cut at 4 MiB (the bound)"}, 4 << 20},
		{"wait, 10 MiB 500", []string{"wait", "--timeoutSeconds", "1", "--periodMillis", "100"}, []string{"500", "answer cut at its first 1024 bytes"}, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, rss, err := runMeasured(t, ns, tc.args...)
			stdout, stderr := out[0], out[1]
			t.Logf("%v: exit %v, peak RSS %d MiB, %d bytes out, stderr %.300q", tc.args, err, rss>>20, stdout.n, stderr.String())
			if err == nil {
				t.Errorf("%v succeeded against a hostile server", tc.args)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr does not say %q: %.500q", w, stderr.String())
				}
			}
			if stderr.n > 8<<10 {
				t.Errorf("stderr is %d bytes: an error body printed whole", stderr.n)
			}
			// The answer held, plus 16 MiB for the runtime around it (the
			// heap's metadata, the transport's buffers, the decoder).
			if grew := rss - start; grew > tc.bound+16<<20 {
				t.Errorf("%v peaked at %d MiB, %d MiB over its own start; want at most its bound (%d MiB) and 16 MiB",
					tc.args, rss>>20, grew>>20, tc.bound>>20)
			}
		})
	}
}

// runMeasured runs the agent's CLI with args in ns under GNU time, which
// reports its child's peak RSS: a child forked from this test would start
// its maxrss at the test's own peak (exec keeps it), which made the figure
// the test's, not the CLI's. It returns its stdout
// and stderr, that peak in bytes, and the command's error.
func runMeasured(t *testing.T, ns string, args ...string) ([2]*countingBuffer, int64, error) {
	t.Helper()
	cmd := exec.Command("/usr/bin/time", append([]string{"-f", "meshagent-peak-kib=%M", "nsenter", "--net=" + ns, e2ekit.AgentBinary}, args...)...)
	out := [2]*countingBuffer{{}, {}}
	cmd.Stdout, cmd.Stderr = out[0], out[1]
	err := cmd.Run()
	m := regexp.MustCompile(`meshagent-peak-kib=(\d+)`).FindStringSubmatch(out[1].String())
	if m == nil {
		t.Fatalf("%v: no peak from /usr/bin/time: %.500q", args, out[1].String())
	}
	kib, _ := strconv.ParseInt(m[1], 10, 64)
	return out, kib << 10, err
}

// countingBuffer keeps the first 64 KiB written and counts the rest. (Not
// an embedded bytes.Buffer: its ReadFrom would take exec's copy whole.)
type countingBuffer struct {
	buf bytes.Buffer
	n   int
}

func (b *countingBuffer) Write(p []byte) (int, error) {
	b.n += len(p)
	if room := 64<<10 - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (b *countingBuffer) String() string { return b.buf.String() }
