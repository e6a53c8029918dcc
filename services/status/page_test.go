package status

import (
	"context"
	"image/color"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// populate gives the fixture an agent worth looking at: a tree with a
// restarted Envoy, a NACKed cluster push whose error holds markup, a
// certificate with three hours left, a name table of two names.
func (f *operatorFixture) populate(t *testing.T, now time.Time) {
	t.Helper()
	since := now.Add(-time.Minute)
	f.tree.Send(messages.TreeState{Services: []messages.ServiceInfo{
		{Name: "identity", Path: "identity", Kind: "supervisor", State: messages.Starting, StateName: "starting", Since: since},
		{Name: "certs", Path: "identity/certs", Kind: "service", State: messages.Ready, StateName: "ready", Since: since},
		{Name: "xds", Path: "xds", Kind: "service", State: messages.Ready, StateName: "ready", Since: since},
		{Name: "envoy", Path: "envoy", Kind: "service", State: messages.Failed, StateName: "failed", Restarts: 3,
			LastError: "envoy exited: signal: killed", Since: since},
	}})
	f.xds.Send(messages.XDSState{Upstream: messages.XDSConnected, Address: "istiod.istio-system.svc:15012", Since: since,
		Types: map[string]messages.XDSTypeState{
			"type.googleapis.com/envoy.config.cluster.v3.Cluster": {SentVersion: "v2", SentResources: 4, SentAt: since, ACKedVersion: "v1",
				NACKs: 1, NACK: &messages.XDSNack{Version: "v2", Error: "cluster <script>alert(1)</script>: bad", At: since}},
			"type.googleapis.com/envoy.config.listener.v3.Listener": {SentVersion: "v1", SentResources: 2, SentAt: since, ACKedVersion: "v1"},
		}})
	ca := pki.NewRoot(t, "root")
	chain, key := ca.Leaf(t, pki.Leaf{SPIFFE: pki.WorkloadID, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(3 * time.Hour)})
	f.certs.Send(messages.CertBundle{CertChainPEM: chain, KeyPEM: key, RootsPEM: ca.CertPEM, Version: "v1", RenewAt: now.Add(90 * time.Minute)})
	f.names.Send(messages.NameTable{Version: "v7", Hosts: map[string]messages.NameInfo{"a.example": {}, "b.example": {}}})
}

// GET /debug/ is the operator's page (issue 22): the tree with states and
// restarts, the xDS verdicts with Envoy's error (escaped), the time the
// certificate has left and the DNS table's size; it refreshes itself,
// loads nothing from elsewhere, and is loopback only.
func TestStatusPageShowsTheAgent(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Second)
	f := newOperatorFixture(t, now)
	f.populate(t, now)
	rec := treeRequest(f.svc, "/debug/", "127.0.0.1:1", nil)
	page := rec.Body.String()
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("GET /debug/ = %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
	for _, want := range []string{
		`<meta http-equiv="refresh" content="5">`,
		">certs<", ">xds<", ">envoy<", ">failed<", ">3<", "envoy exited: signal: killed",
		"istiod.istio-system.svc:15012", ">cds<", ">NACKED<", ">lds<", ">SYNCED<",
		"cluster &lt;script&gt;alert(1)&lt;/script&gt;: bad",
		pki.WorkloadID, "3h0m0s", now.Add(90 * time.Minute).Format(time.RFC3339), "<b>2</b> names",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q:\n%s", want, page)
		}
	}
	for _, external := range []string{"<script", `src="http`, `href="http`, "@import", "url("} {
		if strings.Contains(page, external) {
			t.Errorf("the page holds %q: it must load nothing", external)
		}
	}
	if rec := treeRequest(f.svc, "/debug/", "192.0.2.10:40000", nil); rec.Code != http.StatusForbidden {
		t.Errorf("remote GET /debug/ = %d, want 403", rec.Code)
	}
	if rec := treeRequest(f.svc, "/debug/no-such-page", "127.0.0.1:1", nil); rec.Code != http.StatusNotFound {
		t.Errorf("GET /debug/no-such-page = %d, want 404 (the page is /debug/ alone)", rec.Code)
	}
}

// The page as a browser renders it: headless Chromium (Debian's chromium)
// takes a screenshot of a real status server's /debug/, which must be a
// real picture (the window's size, not one colour), and its DOM names the
// services and the verdicts.
func TestStatusPageInHeadlessChromium(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install chromium): the status page is not checked in a browser")
	}
	now := time.Now().UTC().Truncate(time.Second)
	f := newOperatorFixture(t, now)
	f.populate(t, now)
	url := f.serve(t) + "/debug/"

	dir := t.TempDir()
	shot := filepath.Join(dir, "page.png")
	browse := func(args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// Its own profile, so that runs side by side do not share one; no
		// sandbox, as root in a container has none to give.
		cmd := exec.CommandContext(ctx, chromium, append([]string{"--headless", "--no-sandbox", "--disable-gpu",
			"--user-data-dir=" + filepath.Join(dir, "profile")}, append(args, url)...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
		}
		return out
	}

	browse("--screenshot="+shot, "--window-size=1200,900")
	file, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer file.Close()
	img, err := png.Decode(file)
	if err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1200 || b.Dy() != 900 {
		t.Errorf("screenshot %v, want 1200x900", b)
	}
	colours := map[color.RGBA]int{}
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y++ {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x++ {
			colours[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	if len(colours) < 2 {
		t.Errorf("the screenshot is one colour: nothing was rendered")
	}
	// The page itself, not a browser's error page: the READY banner (no
	// service is required here) is a solid block of its green.
	if banner := colours[color.RGBA{0x2e, 0x7d, 0x32, 0xff}]; banner < 500 {
		t.Errorf("the screenshot has %d pixels of the READY banner's green (%d colours): not the status page", banner, len(colours))
	}
	if dst := os.Getenv("MESHAGENT_SCREENSHOT"); dst != "" {
		b, _ := os.ReadFile(shot)
		_ = os.WriteFile(dst, b, 0o644) // to look at it: MESHAGENT_SCREENSHOT=/tmp/page.png
	}

	dom := string(browse("--dump-dom"))
	for _, want := range []string{"certs", "xds", "envoy", "NACKED", "SYNCED", pki.WorkloadID, "3h0m0s"} {
		if !strings.Contains(dom, want) {
			t.Errorf("Chromium's DOM lacks %q:\n%s", want, dom)
		}
	}
}
