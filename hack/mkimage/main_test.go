package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/meshagent/meshagent/image"
)

// built is the image every test reads, built once as `make image` builds
// it: hack/mkimage lays out the base (the stand-in Envoy static, a
// placeholder for Istio's agent), then `meshagent image` (package image)
// layers the agent and its init onto it (#32).
var built struct {
	once               sync.Once
	err                error
	dir, stdout        string
	agent, init, envoy string
	tmpl               string
	base               *options // mkimage's
	opts               *options // what the final image holds, out its tarball
}

const templateContent = `{"node": {"id": "{{ .nodeID }}"}}` // the tool copies it, never reads it

func builtImage(t *testing.T) *options {
	t.Helper()
	for _, bin := range []string{"/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-legacy-multi"} {
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("the image's iptables come from this host: %v (apt-get install iptables)", err)
		}
	}
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "mkimage-test")
		if built.err != nil {
			return
		}
		built.agent, built.init, built.envoy = filepath.Join(built.dir, "meshagent"), filepath.Join(built.dir, "meshagent-init"), filepath.Join(built.dir, "fakeenvoy")
		for bin, pkg := range map[string]string{built.agent: "../../cmd/meshagent", built.init: "../../cmd/meshagent-init", built.envoy: "../../testdata/fakeenvoy"} {
			cmd := exec.Command("go", "build", "-o", bin, pkg)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				built.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
		}
		built.tmpl = filepath.Join(built.dir, "envoy_bootstrap.json")
		if built.err = os.WriteFile(built.tmpl, []byte(templateContent), 0o600); built.err != nil {
			return
		}
		built.base = &options{
			placeholder: true, envoy: built.envoy, template: built.tmpl,
			tag: "localhost/standin-proxyv2:test", out: filepath.Join(built.dir, "out", "base.tar"),
			labels: keyValues{"io.meshagent.envoy=stand-in (testdata/fakeenvoy): no real Envoy", "org.opencontainers.image.version=v0-test"},
			env:    keyValues{"ISTIO_META_ISTIO_PROXY_SHA=fakeenvoy-test"},
		}
		var stdout bytes.Buffer
		if built.err = build(built.base, &stdout); built.err != nil {
			return
		}
		built.stdout = stdout.String()
		built.opts = &options{agent: built.agent, init: built.init, envoy: built.envoy, template: built.tmpl,
			tag: "localhost/meshagent-proxyv2:test", out: filepath.Join(built.dir, "out", "image.tar")}
		_, built.err = image.Build(context.Background(), image.Options{
			Base: built.base.out, Output: built.opts.out, Tag: built.opts.tag, Version: "v0-test",
			Agents: map[string]image.Binaries{image.OwnPlatform(): image.BinariesBeside(built.agent)},
		})
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.opts
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// The tarball's path is the last line printed (scripts take it from there),
// and the tarball is a docker archive with the tag.
func TestPrintsThePathLast(t *testing.T) {
	builtImage(t)
	o := built.base
	lines := strings.Split(strings.TrimSpace(built.stdout), "\n")
	if lines[len(lines)-1] != o.out {
		t.Fatalf("last line %q, want the tarball's absolute path %q (output %q)", lines[len(lines)-1], o.out, built.stdout)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(o.out) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{o.tag}) {
		t.Fatalf("manifest %+v, want one image tagged %s", m, o.tag)
	}
}

// The image config is proxyv2's: ENTRYPOINT pilot-agent (behind
// meshagent-init once meshagent is layered on, #36), WORKDIR /, plus USER
// istio-proxy, the labels and the environment asked for.
func TestImageConfig(t *testing.T) {
	o := builtImage(t)
	baseCF, err := load(t, built.base).ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if c := baseCF.Config; !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/pilot-agent"}) || len(c.Cmd) != 0 {
		t.Errorf("the base's entrypoint %q cmd %q, want [/usr/local/bin/pilot-agent] and no cmd", c.Entrypoint, c.Cmd)
	}
	img := load(t, o)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	want := []string{"/usr/local/bin/meshagent-init", "/usr/local/bin/pilot-agent", "pilot-agent"}
	if !slices.Equal(c.Entrypoint, want) || len(c.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want %q and no cmd", c.Entrypoint, c.Cmd, want)
	}
	if c.User != "1337:1337" || c.WorkingDir != "/" {
		t.Errorf("user %q workdir %q, want 1337:1337 and /", c.User, c.WorkingDir)
	}
	if c.Labels["io.meshagent.envoy"] != "stand-in (testdata/fakeenvoy): no real Envoy" || c.Labels[image.LabelVersion] != "v0-test" {
		t.Errorf("labels %v", c.Labels)
	}
	if !slices.Contains(c.Env, "PATH="+path) || !slices.Contains(c.Env, "ISTIO_META_ISTIO_PROXY_SHA=fakeenvoy-test") {
		t.Errorf("env %q", c.Env)
	}
	if cf.OS != "linux" || cf.Architecture == "" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
}

// Every file at its path with its mode and owner: the proxy's, and what
// the capture step execs, with every library it loads.
func TestImageFiles(t *testing.T) {
	o := builtImage(t)
	fs := files(t, load(t, o))
	for _, f := range []struct {
		path string
		typ  byte
		mode int64
		uid  int
		src  string // the same bytes as this file
	}{
		{"/usr/local/bin/pilot-agent", tar.TypeReg, 0o755, 0, o.agent},
		{"/usr/local/bin/meshagent-init", tar.TypeReg, 0o755, 0, o.init},
		{"/usr/local/bin/envoy", tar.TypeReg, 0o755, 0, o.envoy},
		{"/var/lib/istio/envoy/envoy_bootstrap_tmpl.json", tar.TypeReg, 0o644, 0, o.template},
		{"/tmp", tar.TypeDir, 0o1777, 0, ""},
		{"/etc/passwd", tar.TypeReg, 0o644, 0, ""},
	} {
		h := fs.headers[f.path]
		if h == nil {
			t.Errorf("%s: missing", f.path)
			continue
		}
		if h.Typeflag != f.typ || h.Mode&0o7777 != f.mode || h.Uid != f.uid {
			t.Errorf("%s: type %c mode %o uid %d, want %c %o %d", f.path, h.Typeflag, h.Mode, h.Uid, f.typ, f.mode, f.uid)
		}
		if f.src != "" {
			want, err := os.ReadFile(f.src)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(fs.content[f.path], want) {
				t.Errorf("%s: not the bytes of %s", f.path, f.src)
			}
		}
	}
	if h := fs.headers["/usr/local/bin/meshagent"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "pilot-agent" {
		t.Errorf("/usr/local/bin/meshagent: %+v, want a symlink to pilot-agent", h)
	}
	for _, d := range []string{"/etc/istio/proxy", "/etc/istio/pod", "/var/lib/istio/data", "/var/run/secrets/tokens",
		"/var/run/secrets/istio", "/var/run/secrets/workload-spiffe-uds", "/var/run/secrets/credential-uds",
		"/var/run/secrets/workload-spiffe-credentials"} {
		if h := fs.headers[d]; h == nil || h.Typeflag != tar.TypeDir || h.Uid != proxyUID || h.Gid != proxyGID {
			t.Errorf("%s: %+v, want a directory owned by 1337:1337", d, h)
		}
	}
	if p := string(fs.content["/etc/passwd"]); !strings.Contains(p, "\nistio-proxy:x:1337:1337:") {
		t.Errorf("/etc/passwd has no istio-proxy 1337:\n%s", p)
	}
	if g := string(fs.content["/etc/group"]); !strings.Contains(g, "\nistio-proxy:x:1337:") {
		t.Errorf("/etc/group has no istio-proxy 1337:\n%s", g)
	}
	// What services/capture and coreos/go-iptables exec, through PATH.
	for name := range iptablesCommands() {
		p, err := fs.resolve("/usr/sbin/" + name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		} else if h := fs.headers[p]; h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 {
			t.Errorf("%s -> %s: not an executable file", name, p)
		}
	}
	for p, h := range fs.headers {
		if h.Typeflag == tar.TypeSymlink {
			if _, err := fs.resolve(p); err != nil {
				t.Errorf("dangling: %v", err)
			}
		}
	}
	fs.checkLibraries(t)
}

// checkLibraries: every ELF file's loader and libraries are in the image,
// where the loader looks for them.
func (fs *imageFiles) checkLibraries(t *testing.T) {
	triplet, err := multiarch()
	if err != nil {
		t.Fatal(err)
	}
	elfs := 0
	for p, b := range fs.content {
		f, err := elf.NewFile(bytes.NewReader(b))
		if err != nil {
			continue
		}
		elfs++
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				interp := make([]byte, prog.Filesz)
				prog.ReadAt(interp, 0)
				if _, err := fs.resolve(strings.TrimRight(string(interp), "\x00")); err != nil {
					t.Errorf("%s: loader: %v", p, err)
				}
			}
		}
		needed, _ := f.ImportedLibraries()
		for _, lib := range needed {
			found := false
			for _, d := range libraryDirs(triplet) {
				if _, err := fs.resolve(d + "/" + lib); err == nil {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s needs %s: not in the image", p, lib)
			}
		}
	}
	if elfs < 4 { // agent, envoy, two xtables, their libraries, the modules
		t.Errorf("only %d ELF files in the image", elfs)
	}
}

func load(t *testing.T, o *options) v1.Image {
	t.Helper()
	img, err := tarball.ImageFromPath(o.out, nil)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// imageFiles is the image's flattened file system.
type imageFiles struct {
	headers map[string]*tar.Header // by absolute path
	content map[string][]byte      // regular files
}

func files(t *testing.T, img v1.Image) *imageFiles {
	t.Helper()
	fs := &imageFiles{headers: map[string]*tar.Header{}, content: map[string][]byte{}}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return fs
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Clean("/" + h.Name)
		fs.headers[p] = h
		if h.Typeflag == tar.TypeReg {
			if fs.content[p], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// resolve follows p's symlinks inside the image to the entry they name.
func (fs *imageFiles) resolve(p string) (string, error) {
	orig := p
	for range 40 {
		parts := strings.Split(strings.TrimPrefix(filepath.Clean(p), "/"), "/")
		cur, relinked := "/", false
		for i, part := range parts {
			next := filepath.Join(cur, part)
			h := fs.headers[next]
			if h == nil {
				return "", fmt.Errorf("%s: %s not in the image", orig, next)
			}
			if h.Typeflag == tar.TypeSymlink {
				target := h.Linkname
				if !filepath.IsAbs(target) {
					target = filepath.Join(cur, target)
				}
				p, relinked = filepath.Join(append([]string{target}, parts[i+1:]...)...), true
				break
			}
			cur = next
		}
		if !relinked {
			return cur, nil
		}
	}
	return "", fmt.Errorf("%s: too many symlinks", orig)
}

// `make image-istio`'s layout (an agent in Istio's place, no placeholder)
// is a base `meshagent image` takes as it takes Istio's proxyv2 (#32): the
// agent replaced, the rest kept.
func TestAgentLayoutIsABase(t *testing.T) {
	builtImage(t)
	oracle := &options{
		agent: built.envoy, // any executable stands for Istio's agent here
		envoy: built.envoy, template: built.tmpl,
		tag: "localhost/istio-proxyv2:test", out: filepath.Join(built.dir, "out", "oracle.tar"),
	}
	if err := build(oracle, io.Discard); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(built.dir, "out", "on-oracle.tar")
	if _, err := image.Build(context.Background(), image.Options{
		Base: oracle.out, Output: out, Version: "v0-test",
		Agents: map[string]image.Binaries{image.OwnPlatform(): image.BinariesBeside(built.agent)},
	}); err != nil {
		t.Fatal(err)
	}
	fs := files(t, load(t, &options{out: out}))
	want, err := os.ReadFile(built.agent)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fs.content[image.AgentPath], want) {
		t.Errorf("%s is not meshagent", image.AgentPath)
	}
	if envoy, _ := os.ReadFile(built.envoy); !bytes.Equal(fs.content[image.EnvoyPath], envoy) {
		t.Errorf("%s is not the base's Envoy", image.EnvoyPath)
	}
}
