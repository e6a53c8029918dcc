package dnsproxy

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/testdata/testkit"
)

const tableV1 = `{"table": {
  "reviews.default.svc.cluster.local": {"ips": ["10.0.0.1"], "registry": "Kubernetes", "shortname": "reviews", "namespace": "default"},
  "*.wild.example.com": {"ips": ["192.0.2.10", "2001:db8::10"]}
}}`

const tableV2 = `{"table": {
  "reviews.default.svc.cluster.local": {"ips": ["10.0.0.2"], "registry": "Kubernetes", "shortname": "reviews", "namespace": "default"}
}}`

func startTableFile(t *testing.T, path string) (*messages.Cell[messages.NameTable], *testkit.HealthRecorder) {
	t.Helper()
	out, h := messages.NewCell[messages.NameTable](), &testkit.HealthRecorder{}
	tf := NewTableFile(path, out, messages.NewRuntime(TableFileName, h, nil, nil, testLogger(t)))
	if tf.String() != "nametable" {
		t.Errorf("String() = %q", tf.String())
	}
	testkit.Serve(t, tf)
	return out, h
}

func reviewsIP(nt messages.NameTable) string {
	if ips := nt.Hosts["reviews.default.svc.cluster.local"].IPs; len(ips) == 1 {
		return ips[0].String()
	}
	return ""
}

func TestTableFileLoadReloadBad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nametable.json")
	if err := os.WriteFile(path, []byte(tableV1), 0o644); err != nil {
		t.Fatal(err)
	}
	out, h := startTableFile(t, path)
	v1 := testkit.WaitValue[messages.NameTable](t, out, "v1", func(nt messages.NameTable) bool { return reviewsIP(nt) == "10.0.0.1" })
	if w := v1.Hosts["*.wild.example.com"]; len(w.IPs) != 2 || w.IPs[1] != netip.MustParseAddr("2001:db8::10") {
		t.Fatalf("wildcard = %+v", w)
	}
	if v1.Version == "" {
		t.Fatal("no version")
	}
	h.WaitLast(t, "ready", func(v messages.Health) bool { return v.State == messages.Ready && v.Service == "nametable" })

	// Changed in place.
	if err := os.WriteFile(path, []byte(tableV2), 0o644); err != nil {
		t.Fatal(err)
	}
	v2 := testkit.WaitValue[messages.NameTable](t, out, "v2", func(nt messages.NameTable) bool { return reviewsIP(nt) == "10.0.0.2" })
	if v2.Version == v1.Version {
		t.Fatal("version did not change")
	}

	// Bad JSON: the last table stays, Degraded names the file and error.
	if err := os.WriteFile(path, []byte(`{"table": {`), 0o644); err != nil {
		t.Fatal(err)
	}
	d := h.WaitLast(t, "degraded", func(v messages.Health) bool { return v.State == messages.Degraded })
	if !strings.Contains(d.Reason, path) {
		t.Errorf("reason %q does not name the file", d.Reason)
	}
	if got, _ := out.Get(); got.Version != v2.Version {
		t.Errorf("bad file replaced the table: %+v", got)
	}

	// Bad IP: names the host and the value.
	if err := os.WriteFile(path, []byte(`{"table": {"x.example": {"ips": ["10.0.0.999"]}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	d = h.WaitLast(t, "degraded for the IP", func(v messages.Health) bool {
		return v.State == messages.Degraded && strings.Contains(v.Reason, "10.0.0.999")
	})
	if !strings.Contains(d.Reason, `"x.example"`) {
		t.Errorf("reason %q does not name the host", d.Reason)
	}

	// Atomic replace (write a temp file, rename over): picked up, Ready again.
	tmp := filepath.Join(dir, ".nametable.tmp")
	if err := os.WriteFile(tmp, []byte(tableV1), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	testkit.WaitValue[messages.NameTable](t, out, "v1 again", func(nt messages.NameTable) bool { return reviewsIP(nt) == "10.0.0.1" })
	h.WaitLast(t, "ready again", func(v messages.Health) bool { return v.State == messages.Ready })

	// Removed: Degraded, table kept.
	os.Remove(path)
	h.WaitLast(t, "degraded when removed", func(v messages.Health) bool { return v.State == messages.Degraded })
	if got, _ := out.Get(); reviewsIP(got) != "10.0.0.1" {
		t.Errorf("table lost when the file was removed")
	}
}

func TestTableFileMissingDirectory(t *testing.T) {
	tf := NewTableFile("/nonexistent/dir/nametable.json", messages.NewCell[messages.NameTable](), messages.NewRuntime(TableFileName, &testkit.HealthRecorder{}, nil, nil, nil))
	if err := tf.Serve(t.Context()); err == nil || !strings.Contains(err.Error(), "/nonexistent/dir/nametable.json") {
		t.Errorf("Serve = %v", err)
	}
}

// The file feeds the proxy: a reload changes what it answers.
func TestTableFileDrivesProxy(t *testing.T) {
	up := startDnsmasq(t)
	path := filepath.Join(t.TempDir(), "nametable.json")
	if err := os.WriteFile(path, []byte(tableV1), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := startTableFile(t, path)
	h := &testkit.HealthRecorder{}
	svc, err := New(Config{Listen: "127.0.0.1:0", Namespace: "default", ResolvConf: writeResolvConf(t, up), ForwardTimeout: 5 * time.Second}, out, messages.NewRuntime(Name, h, nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, svc)
	h.WaitLast(t, "ready", func(v messages.Health) bool { return v.State == messages.Ready })
	addr := svc.Addrs()[0]
	get := func() string {
		r := exchange(t, addr, "reviews.", dns.TypeA, "udp")
		if len(r.Answer) != 1 {
			return ""
		}
		return r.Answer[0].(*dns.A).A.String()
	}
	if got := get(); got != "10.0.0.1" {
		t.Fatalf("reviews. = %q", got)
	}
	if err := os.WriteFile(path, []byte(tableV2), 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the reload to reach the proxy", func() bool { return get() == "10.0.0.2" })
}

func TestNDSZ(t *testing.T) {
	nt := testTable("v9")
	p := startProxy(t, Config{ResolvConf: writeResolvConf(t, "127.99.0.1")}, nil)
	rec := httptest.NewRecorder()
	p.svc.NDSZ().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/ndsz", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("before the table: %d", rec.Code)
	}
	p.table.Send(nt)
	p.health.WaitLast(t, "ready", func(v messages.Health) bool { return v.State == messages.Ready })
	rec = httptest.NewRecorder()
	p.svc.NDSZ().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/ndsz", nil))
	var got ndsz
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	r := got.Table["reviews.default.svc.cluster.local"]
	want := []string{"reviews.", "reviews.alias.test.", "reviews.default.", "reviews.default.svc."}
	if got.Version != "v9" || !slices.Equal(r.AltHosts, want) || len(r.IPs) != 3 {
		t.Errorf("ndsz = %+v, reviews = %+v", got.Version, r)
	}
}

// A name-table path that is not a regular file is an error naming the
// file, never a read without end (/dev/zero) or a block (a FIFO), issue
// #21.
func TestTableFileNotRegular(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "names.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{fifo: "not a regular file (a FIFO)", "/dev/zero": "not a regular file (a character device)"} {
		_, err := ReadTableFile(path)
		if !errors.Is(err, boundedfile.ErrNotRegular) {
			t.Fatalf("ReadTableFile(%s) = %v, want ErrNotRegular", path, err)
		}
		testkit.Contains(t, "the error", err.Error(), "name table file "+path, want)
	}
}
