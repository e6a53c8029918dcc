package nametable

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/services/internal/filewatch"
	"github.com/meshagent/meshagent/testdata/testkit"
)

const tableV1 = `{"table": {
  "reviews.default.svc.cluster.local": {"ips": ["10.0.0.1"], "registry": "Kubernetes", "shortname": "reviews", "namespace": "default"},
  "*.wild.example.com": {"ips": ["192.0.2.10", "2001:db8::10"]}
}}`

const tableV2 = `{"table": {
  "reviews.default.svc.cluster.local": {"ips": ["10.0.0.2"], "registry": "Kubernetes", "shortname": "reviews", "namespace": "default"}
}}`

func startTableFile(t *testing.T, path string, clock messages.Clock) (*messages.Cell[messages.NameTable], *testkit.HealthRecorder) {
	t.Helper()
	out, h := messages.NewCell[messages.NameTable](), &testkit.HealthRecorder{}
	svc, err := New(Config{File: path}, Inputs{}, Outputs{Table: out}, messages.NewRuntime(Name, h, clock, nil, testkit.NewLogBuffer(t).Logger()))
	if err != nil {
		t.Fatal(err)
	}
	if svc.String() != "nametable" {
		t.Errorf("String() = %q", svc.String())
	}
	testkit.Serve(t, svc)
	return out, h
}

func reviewsIP(nt messages.NameTable) string {
	if ips := nt.Hosts["reviews.default.svc.cluster.local"].IPs; len(ips) == 1 {
		return ips[0].String()
	}
	return ""
}

func TestLoadReloadBad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nametable.json")
	if err := os.WriteFile(path, []byte(tableV1), 0o644); err != nil {
		t.Fatal(err)
	}
	out, h := startTableFile(t, path, nil)
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

// A ConfigMap volume is updated by renaming a "..data" symlink to a new
// generation's directory: no event names the file itself, which the old
// loop filtered on, so the table was never reloaded (#26).
func TestConfigMapDataSwap(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nametable.json")
	testkit.ProjectVolume(t, dir, map[string][]byte{"nametable.json": []byte(tableV1)})
	out, _ := startTableFile(t, path, nil)
	testkit.WaitValue[messages.NameTable](t, out, "v1", func(nt messages.NameTable) bool { return reviewsIP(nt) == "10.0.0.1" })

	testkit.ProjectVolume(t, dir, map[string][]byte{"nametable.json": []byte(tableV2)})
	testkit.WaitValue[messages.NameTable](t, out, "v2 after the swap", func(nt messages.NameTable) bool { return reviewsIP(nt) == "10.0.0.2" })
}

// A file in a directory that does not exist yet is waited for (Degraded,
// naming the file) and loaded once the directory and the file appear, as
// when a ConfigMap volume is mounted late (#26). The service used to fail
// at once and be restarted with backoff.
func TestMissingDirectoryWaitedFor(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "names")
	path := filepath.Join(dir, "nametable.json")
	clock := testkit.NewManualClock()
	out, h := startTableFile(t, path, clock)
	d := h.WaitLast(t, "degraded", func(v messages.Health) bool { return v.State == messages.Degraded })
	testkit.Contains(t, "the reason", d.Reason, path)

	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(tableV1), 0o644); err != nil {
		t.Fatal(err)
	}
	// The clock moves the retry; nothing else does.
	testkit.WaitFor(t, "the table once its directory appears", func() bool {
		clock.Advance(filewatch.DefaultRetry)
		nt, ok := out.Get()
		return ok && reviewsIP(nt) == "10.0.0.1"
	})
	h.WaitLast(t, "ready", func(v messages.Health) bool { return v.State == messages.Ready })
}

// A name-table path that is not a regular file is an error naming the
// file, never a read without end (/dev/zero) or a block (a FIFO), issue
// #21.
func TestNotRegular(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "names.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{fifo: "not a regular file (a FIFO)", "/dev/zero": "not a regular file (a character device)"} {
		_, err := ReadFile(path)
		if !errors.Is(err, boundedfile.ErrNotRegular) {
			t.Fatalf("ReadFile(%s) = %v, want ErrNotRegular", path, err)
		}
		testkit.Contains(t, "the error", err.Error(), "name table file "+path, want)
	}
}

// FuzzTableFile feeds arbitrary content to the name-table file's parser
// (--name-table): it must never panic, and a table it accepts holds only
// valid addresses and the version the content hashes to.
func FuzzTableFile(f *testing.F) {
	f.Add([]byte(tableV1))
	f.Add([]byte(tableV2))
	f.Add([]byte(`{"table": {"a.example": {"ips": ["not-an-ip"]}}}`))
	f.Add([]byte(`{"table": {"": {"ips": ["::1"], "altHosts": ["b", "c"]}}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte("\xff\xfe"))
	f.Fuzz(func(t *testing.T, b []byte) {
		nt, err := parseTable(b)
		if err != nil {
			return
		}
		again, err := parseTable(b)
		if err != nil || again.Version != nt.Version || !strings.HasPrefix(nt.Version, "file-") {
			t.Fatalf("the same content parsed twice: versions %q, %q (%v)", nt.Version, again.Version, err)
		}
		for host, info := range nt.Hosts {
			for _, ip := range info.IPs {
				if !ip.IsValid() {
					t.Fatalf("host %q has an invalid address", host)
				}
			}
		}
	})
}
