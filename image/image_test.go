package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// agents are real Linux executables for amd64 and arm64 (meshagent-init,
// small and static, stands for the agent here: what the layer holds is
// checked byte for byte), each with an init beside it.
var agents = map[string]Binaries{}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "image-test-")
	if err != nil {
		log.Fatal(err)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		d := filepath.Join(dir, arch)
		for _, name := range []string{"meshagent", InitName} {
			cmd := exec.Command("go", "build", "-ldflags", "-s -w", "-o", filepath.Join(d, name), "../cmd/meshagent-init")
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
			if out, err := cmd.CombinedOutput(); err != nil {
				log.Fatalf("build %s for %s: %v\n%s", name, arch, err, out)
			}
		}
		// The agent's bytes differ from its init's (trailing bytes leave
		// an ELF file valid), so that a swap would show.
		f, err := os.OpenFile(filepath.Join(d, "meshagent"), os.O_APPEND|os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteString("the agent for " + arch)
			f.Close()
		}
		if err != nil {
			log.Fatal(err)
		}
		agents["linux/"+arch] = BinariesBeside(filepath.Join(d, "meshagent"))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// serve is an OCI registry on loopback, as a user's registry.
func serve(t *testing.T) string {
	t.Helper()
	s := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

// baseFiles are proxyv2's files, per architecture, so that a test can tell
// which platform's Envoy it reads.
func baseFiles(arch string) map[string]string {
	return map[string]string{
		EnvoyPath:     "envoy for " + arch,
		AgentPath:     "istio's pilot-agent for " + arch,
		TemplatePath:  `{"node": {}}`,
		"/etc/passwd": "istio-proxy:x:1337:1337::/nonexistent:/sbin/nologin\n",
	}
}

// tarLayer is a layer of files (a content "" and a name starting ".wh."
// make a whiteout, as docker writes one).
func tarLayer(t *testing.T, files map[string]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range slices.Sorted(maps.Keys(files)) {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: 0o755, Size: int64(len(files[p]))}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, files[p])
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// proxyv2 is a base as Istio's: a random layer (the distro), the proxy's
// layer, extra layers, and proxyv2's config.
func proxyv2(t *testing.T, arch string, files map[string]string, extra ...v1.Layer) v1.Image {
	t.Helper()
	distro, err := random.Layer(2048, types.DockerLayer)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, append([]v1.Layer{distro, tarLayer(t, files)}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Entrypoint = []string{AgentPath}
	cf.Config.Cmd = []string{"proxy", "sidecar"} // Istio's has none; a base's command must stay
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin", "ISTIO_META_ISTIO_PROXY_SHA=abc123"}
	cf.Config.Labels = map[string]string{"vendor": "istio"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// push pushes an image or an index.
func push(t *testing.T, ref string, img remote.Taggable) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	switch x := img.(type) {
	case v1.Image:
		err = remote.Write(r, x)
	case v1.ImageIndex:
		err = remote.WriteIndex(r, x)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// index is a multi-platform base of amd64 and arm64.
func index(t *testing.T) v1.ImageIndex {
	t.Helper()
	var adds []mutate.IndexAddendum
	for _, arch := range []string{"amd64", "arm64"} {
		adds = append(adds, mutate.IndexAddendum{Add: proxyv2(t, arch, baseFiles(arch)),
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	return mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
}

func build(t *testing.T, o Options) (Result, string, error) {
	t.Helper()
	var progress bytes.Buffer
	o.Progress = &progress
	o.Version = "v1.2.3-test"
	if o.Agents == nil {
		o.Agents = agents
	}
	res, err := Build(context.Background(), o)
	return res, progress.String(), err
}

// The base's platforms each get one layer on top of the base's own: the
// agent as pilot-agent, its init, the meshagent name; the base's Envoy and
// config stay, labels name both versions; the digest is the registry's.
func TestLayersMeshagentOntoProxyv2(t *testing.T) {
	reg := serve(t)
	single := proxyv2(t, "amd64", baseFiles("amd64"))
	push(t, reg+"/istio/proxyv2:1.28.1", single)
	push(t, reg+"/istio/proxyv2-multi:1.28.1", index(t))

	for _, tc := range []struct {
		name, base string
		platforms  []string
	}{
		{"single", reg + "/istio/proxyv2:1.28.1", []string{"linux/amd64"}},
		{"index", reg + "/istio/proxyv2-multi:1.28.1", []string{"linux/amd64", "linux/arm64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := reg + "/mesh/meshagent-proxyv2-" + tc.name + ":1.28.1"
			res, progress, err := build(t, Options{Base: tc.base, Push: dest})
			if err != nil {
				t.Fatalf("%v\nprogress:\n%s", err, progress)
			}
			if !slices.Equal(res.Platforms, tc.platforms) {
				t.Fatalf("platforms %v, want %v", res.Platforms, tc.platforms)
			}
			ref, _ := name.ParseReference(dest)
			head, err := remote.Head(ref)
			if err != nil {
				t.Fatal(err)
			}
			if head.Digest != res.Digest {
				t.Fatalf("digest %s, the registry has %s", res.Digest, head.Digest)
			}
			for _, want := range []string{"layer 1/2", "has proxyv2's shape", "meshagent layered onto", "behind its init", "pushing " + dest} {
				if !strings.Contains(progress, want) {
					t.Errorf("progress lacks %q:\n%s", want, progress)
				}
			}
			baseRef, _ := name.ParseReference(tc.base)
			for _, pl := range tc.platforms {
				p, _ := v1.ParsePlatform(pl)
				got, err := remote.Image(ref, remote.WithPlatform(*p))
				if err != nil {
					t.Fatal(err)
				}
				was, err := remote.Image(baseRef, remote.WithPlatform(*p))
				if err != nil {
					t.Fatal(err)
				}
				checkLayered(t, pl, was, got, agents[pl], tc.base+"@", "1.28.1 (the base's tag)")
			}
		})
	}
}

// checkLayered: got is was with one layer (bin's agent and init, the
// meshagent name) and labels added, the init in front of the agent as
// entrypoint, its Envoy and config otherwise kept.
func checkLayered(t *testing.T, pl string, was, got v1.Image, bin Binaries, baseLabel, istioVersion string) {
	t.Helper()
	wasLayers, _ := was.Layers()
	gotLayers, err := got.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(gotLayers) != len(wasLayers)+1 {
		t.Fatalf("%s: %d layers, want the base's %d and one", pl, len(gotLayers), len(wasLayers))
	}
	for i, l := range wasLayers {
		a, _ := l.Digest()
		b, _ := gotLayers[i].Digest()
		if a != b {
			t.Fatalf("%s: layer %d changed: %s, was %s", pl, i, b, a)
		}
	}
	files := readLayer(t, gotLayers[len(gotLayers)-1])
	wantAgent, _ := os.ReadFile(bin.Agent)
	wantInit, _ := os.ReadFile(bin.Init)
	for p, want := range map[string][]byte{AgentPath: wantAgent, InitPath: wantInit} {
		f, ok := files[p]
		if !ok || f.h.Mode != 0o755 || f.h.Uid != 0 || !bytes.Equal(f.data, want) {
			t.Errorf("%s: %s in the new layer: %v, mode %o, uid %d, %d bytes; want %s (%d bytes), 0755, root", pl, p, ok, f.h.Mode, f.h.Uid, len(f.data), bin.Agent, len(want))
		}
	}
	if f := files[AgentAlias]; f.h.Typeflag != tar.TypeSymlink || f.h.Linkname != "pilot-agent" {
		t.Errorf("%s: %s: %+v, want a symlink to pilot-agent", pl, AgentAlias, f.h)
	}
	if len(files) != 3 {
		t.Errorf("%s: the new layer holds %d entries, want 3", pl, len(files))
	}
	arch := strings.TrimPrefix(pl, "linux/")
	if f := flattened(t, got)[EnvoyPath]; string(f.data) != "envoy for "+arch {
		t.Errorf("%s: Envoy %q, want the base's", pl, f.data)
	}
	wasCF, _ := was.ConfigFile()
	gotCF, _ := got.ConfigFile()
	wantLabels := map[string]string{"vendor": "istio", LabelVersion: "v1.2.3-test", LabelIstioVersion: istioVersion, LabelAgent: "meshagent"}
	for k, v := range wantLabels {
		if gotCF.Config.Labels[k] != v {
			t.Errorf("%s: label %s=%q, want %q", pl, k, gotCF.Config.Labels[k], v)
		}
	}
	if !strings.HasPrefix(gotCF.Config.Labels[LabelBase], baseLabel+"sha256:") {
		t.Errorf("%s: label %s=%q, want the base with its digest", pl, LabelBase, gotCF.Config.Labels[LabelBase])
	}
	// Istio's entrypoint becomes the init in front of the agent (#36); the
	// base's command and the rest stay.
	if !slices.Equal(wasCF.Config.Entrypoint, []string{AgentPath}) {
		t.Fatalf("%s: the base's entrypoint is %q, not Istio's", pl, wasCF.Config.Entrypoint)
	}
	want := []string{"/usr/local/bin/meshagent-init", "/usr/local/bin/pilot-agent", "pilot-agent"}
	if !slices.Equal(gotCF.Config.Entrypoint, want) {
		t.Errorf("%s: entrypoint %q, want %q", pl, gotCF.Config.Entrypoint, want)
	}
	a, b := wasCF.Config, gotCF.Config
	a.Labels, b.Labels = nil, nil
	a.Entrypoint, b.Entrypoint = nil, nil
	if fmt.Sprint(a) != fmt.Sprint(b) || wasCF.OS != gotCF.OS || wasCF.Architecture != gotCF.Architecture {
		t.Errorf("%s: config changed beyond labels and entrypoint:\n%+v\nwas\n%+v", pl, b, a)
	}
}

type entry struct {
	h    *tar.Header
	data []byte
}

func readTar(t *testing.T, r io.Reader) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out["/"+strings.TrimPrefix(h.Name, "/")] = entry{h, b}
	}
}

func readLayer(t *testing.T, l v1.Layer) map[string]entry {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	return readTar(t, rc)
}

func flattened(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	return readTar(t, rc)
}

// A local base (`make image`: hack/mkimage's tarball) written to a file:
// a docker-archive that `ctr images import` reads, named by Tag; an index
// to an OCI archive.
func TestLocalBaseToFile(t *testing.T) {
	dir := t.TempDir()
	baseTar := filepath.Join(dir, "base.tar")
	tag, _ := name.NewTag("localhost/proxyv2-standin:base")
	if err := tarball.WriteToFile(baseTar, tag, proxyv2(t, "amd64", baseFiles("amd64"))); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out", "meshagent.tar")
	res, progress, err := build(t, Options{Base: baseTar, Output: out, Tag: "localhost/meshagent-proxyv2:dev",
		Labels: map[string]string{"io.meshagent.envoy": "stand-in"}})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress)
	}
	outTag, _ := name.NewTag("localhost/meshagent-proxyv2:dev")
	got, err := tarball.ImageFromPath(out, &outTag)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := got.Digest(); d != res.Digest {
		t.Fatalf("digest %s, the file holds %s", res.Digest, d)
	}
	was, err := tarball.ImageFromPath(baseTar, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkLayered(t, "linux/amd64", was, got, agents["linux/amd64"], baseTar+"@", "unknown")
	if cf, _ := got.ConfigFile(); cf.Config.Labels["io.meshagent.envoy"] != "stand-in" {
		t.Errorf("labels %v: no io.meshagent.envoy asked for", cf.Config.Labels)
	}

	// An index goes to an OCI archive: index.json names it.
	multi := filepath.Join(dir, "multi.tar")
	reg := serve(t)
	push(t, reg+"/istio/proxyv2:1.28.1", index(t))
	if _, progress, err := build(t, Options{Base: reg + "/istio/proxyv2:1.28.1", Output: multi, Tag: "localhost/meshagent-proxyv2:multi"}); err != nil {
		t.Fatalf("%v\n%s", err, progress)
	}
	f, err := os.Open(multi)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries := readTar(t, f)
	if !strings.Contains(string(entries["/index.json"].data), "localhost/meshagent-proxyv2:multi") {
		t.Errorf("index.json: %s", entries["/index.json"].data)
	}
	if _, ok := entries["/oci-layout"]; !ok {
		t.Error("no oci-layout in the archive")
	}
	// One platform of an index, to a file: a docker-archive of that image.
	arm := filepath.Join(dir, "arm64.tar")
	res, progress, err = build(t, Options{Base: reg + "/istio/proxyv2:1.28.1", Platforms: []string{"linux/arm64"}, Output: arm, Tag: "localhost/meshagent-proxyv2:arm64"})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress)
	}
	img, err := tarball.ImageFromPath(arm, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cf, _ := img.ConfigFile(); cf.Architecture != "arm64" {
		t.Errorf("%s holds a %s image", arm, cf.Architecture)
	}
	if d, _ := img.Digest(); d != res.Digest {
		t.Errorf("digest %s, the file holds %s", res.Digest, d)
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, "*.tar.*"))
	if len(leftovers) > 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}

// must is v of a parse of the test's own fixed text, which cannot fail
// but by a mistake in the test (a panic names it).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A plain-HTTP registry under a name that is no loopback or private
// address is spoken to only with Insecure (--insecure).
func TestInsecureRegistryByName(t *testing.T) {
	reg := serve(t)
	_, port, _ := strings.Cut(reg, ":")
	push(t, reg+"/istio/proxyv2:1.28.1", proxyv2(t, "amd64", baseFiles("amd64")))
	// registry.test resolves, for this transport only, to the loopback registry.
	dialer := &net.Dialer{}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialer.DialContext(ctx, network, strings.Replace(addr, "registry.test", "127.0.0.1", 1))
	}
	o := Options{Base: "registry.test:" + port + "/istio/proxyv2:1.28.1", Push: "registry.test:" + port + "/mesh/out:1", Transport: transport}
	if _, _, err := build(t, o); !errors.Is(err, ErrBase) || !strings.Contains(err.Error(), "https://registry.test:"+port) {
		t.Fatalf("without Insecure: %v, want the base unreadable over HTTPS", err)
	}
	o.Insecure = true
	if _, progress, err := build(t, o); err != nil {
		t.Fatalf("with Insecure: %v\n%s", err, progress)
	}
}

// A base whose entrypoint is not Istio's (its own wrapper around
// pilot-agent) keeps it, and the progress says so: the init in front would
// bypass the wrapper (#36).
func TestForeignEntrypointKept(t *testing.T) {
	dir := t.TempDir()
	base := proxyv2(t, "amd64", baseFiles("amd64"))
	cf, err := base.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config.Entrypoint = []string{"/usr/local/bin/wrapper.sh", "pilot-agent"}
	base = must(mutate.ConfigFile(base, cf))
	baseTar := filepath.Join(dir, "base.tar")
	if err := tarball.WriteToFile(baseTar, must(name.NewTag("localhost/proxyv2-wrapped:base")), base); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.tar")
	_, progress, err := build(t, Options{Base: baseTar, Output: out})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress)
	}
	got, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	gotCF := must(got.ConfigFile())
	if !slices.Equal(gotCF.Config.Entrypoint, cf.Config.Entrypoint) || !slices.Equal(gotCF.Config.Cmd, cf.Config.Cmd) {
		t.Errorf("entrypoint %q cmd %q, want the base's %q %q", gotCF.Config.Entrypoint, gotCF.Config.Cmd, cf.Config.Entrypoint, cf.Config.Cmd)
	}
	if !strings.Contains(progress, `entrypoint ["/usr/local/bin/wrapper.sh" "pilot-agent"] kept: not Istio's`) {
		t.Errorf("progress does not say the entrypoint was kept:\n%s", progress)
	}
}
