// Command mkimage builds the sidecar image in the layout of Istio's proxyv2
// image without a container daemon or a registry (#20): a docker-archive
// tarball, tagged, that `ctr -n k8s.io images import` and `docker load` read.
// Its last line of output is the tarball's path.
//
//	go run ./hack/mkimage -agent bin/meshagent -envoy bin/envoy \
//	    -bootstrap-template envoy_bootstrap.json -tag localhost/meshagent-proxyv2:dev \
//	    -o bin/meshagent-proxyv2-image.tar [-label k=v]... [-env K=V]...
//
// `make image` runs it with -placeholder-agent: the result is the base
// that `meshagent image` then layers meshagent onto (#32), as it layers it
// onto Istio's own proxyv2 for users, so that one code path puts the agent
// in both. The same tool builds the oracle image with Istio's own
// pilot-agent as -agent (`make image-istio`), itself a valid base. The image has two layers: the system one
// (iptables and the shared libraries it and a dynamically linked agent load,
// copied from this host, plus /etc/passwd and /etc/group with istio-proxy)
// and the proxy one (agent, Envoy, bootstrap template, the writable
// directories of an injected pod). Every timestamp is the epoch, so equal
// inputs give equal digests, and both images share the system layer.
package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/meshagent/meshagent/image"
)

// options are the tool's flags.
type options struct {
	agent, init, envoy, template string // host paths of what goes in (init: optional)
	placeholder                  bool   // a placeholder instead of agent: a base for `meshagent image`
	tag, out                     string
	labels, env                  keyValues
}

// keyValues is a repeatable K=V flag.
type keyValues []string

func (kv *keyValues) String() string { return strings.Join(*kv, ",") }
func (kv *keyValues) Set(s string) error {
	if k, _, ok := strings.Cut(s, "="); !ok || k == "" {
		return fmt.Errorf("%q: want KEY=VALUE", s)
	}
	*kv = append(*kv, s)
	return nil
}

var errUsage = errors.New("usage")

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.agent, "agent", "", "the agent binary, installed as "+image.AgentPath+" (or -placeholder-agent)")
	fs.BoolVar(&o.placeholder, "placeholder-agent", false, "lay out a base for `meshagent image`: a placeholder file where Istio's agent goes, no init")
	fs.StringVar(&o.init, "init", "", "the agent's init (cmd/meshagent-init), installed as "+image.InitPath+" (optional: Istio's agent has none)")
	fs.StringVar(&o.envoy, "envoy", "", "the Envoy binary, installed as "+image.EnvoyPath+" (required)")
	fs.StringVar(&o.template, "bootstrap-template", "", "Istio's envoy_bootstrap.json, installed as "+image.TemplatePath+" (required)")
	fs.StringVar(&o.tag, "tag", "localhost/meshagent-proxyv2:dev", "the image's name:tag")
	fs.StringVar(&o.out, "o", "bin/meshagent-proxyv2-image.tar", "the docker-archive tarball to write")
	fs.Var(&o.labels, "label", "an image label KEY=VALUE (repeatable)")
	fs.Var(&o.env, "env", "an environment variable KEY=VALUE of the image (repeatable)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if (o.agent == "") == !o.placeholder || o.envoy == "" || o.template == "" || fs.NArg() > 0 {
		fs.Usage()
		return nil, fmt.Errorf("%w: one of -agent and -placeholder-agent, -envoy and -bootstrap-template are required, and no arguments", errUsage)
	}
	if o.placeholder && o.init != "" {
		return nil, fmt.Errorf("%w: -init goes with -agent; `meshagent image` adds the init beside the agent", errUsage)
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(2)
	}
	if err := build(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// build writes the image o describes and prints its tag and digest, then
// its path on the last line.
func build(o *options, stdout io.Writer) error {
	tag, err := name.NewTag(o.tag)
	if err != nil {
		return err
	}
	triplet, err := multiarch()
	if err != nil {
		return err
	}
	bins := []string{o.envoy}
	if o.agent != "" {
		bins = append(bins, o.agent)
	}
	system, err := systemTree(triplet, bins...)
	if err != nil {
		return err
	}
	proxy, err := proxyTree(o)
	if err != nil {
		return err
	}
	img := empty.Image
	for _, t := range []*tree{system, proxy} {
		layer, err := layerOf(t)
		if err != nil {
			return err
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return err
		}
	}
	if img, err = configure(img, o); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	if err := tarball.WriteToFile(o.out, tag, img); err != nil {
		return fmt.Errorf("write %s: %w", o.out, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s %s\n", tag, digest)
	abs, err := filepath.Abs(o.out)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, abs)
	return nil
}

const caBundle = "/etc/ssl/certs/ca-certificates.crt"

// systemTree is the layer a base image would give: iptables and the
// libraries the agent and Envoy load (none when they are static), the users.
func systemTree(triplet string, bins ...string) (*tree, error) {
	t := newTree()
	t.dir("/tmp", 0o1777, 0, 0)
	t.dir("/run", 0o755, 0, 0) // iptables-legacy's lock, /run/xtables.lock
	h := newHost(t, triplet)
	if err := h.addIptables(triplet); err != nil {
		return nil, err
	}
	// Istio's base images carry the OS roots (ca-certificates): its agent
	// warns "OS CA Cert could not be found" without them, and both agents
	// use them for a control plane or CA whose certificate is public.
	if _, err := os.Stat(caBundle); err == nil {
		if _, err := h.addPath(caBundle); err != nil {
			return nil, err
		}
	}
	for _, b := range bins {
		if err := h.addLibrariesOf(b); err != nil {
			return nil, err
		}
	}
	// As Istio's distroless base (docker/Dockerfile.distroless): root and
	// istio-proxy, no shell.
	t.file("/etc/passwd", 0o644, 0, 0, fmt.Appendf(nil,
		"root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:%s:/nonexistent:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n",
		proxyUser, proxyUID, proxyGID, proxyUser))
	t.file("/etc/group", 0o644, 0, 0, fmt.Appendf(nil, "root:x:0:\n%s:x:%d:\nnobody:x:65534:\n", proxyUser, proxyGID))
	// The container runtime mounts its own /etc/hosts over this one; it is
	// here for a bare chroot or `docker run --network none`, where
	// "pilot-agent request" still dials localhost:15000 as Istio's does.
	t.file("/etc/hosts", 0o644, 0, 0, []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"))
	return t, nil
}

// placeholderAgent holds Istio's agent's place in a base for `meshagent
// image`, which replaces it; run, it fails with this message.
const placeholderAgent = "#!/bin/false\n# placeholder: `meshagent image` puts the agent here (make image)\n"

// proxyTree is proxyv2's own layer.
func proxyTree(o *options) (*tree, error) {
	t := newTree()
	for _, f := range []struct {
		dst, src string
		mode     int64
	}{
		{image.EnvoyPath, o.envoy, 0o755},
		{image.TemplatePath, o.template, 0o644},
	} {
		if err := t.copyFile(f.dst, f.src, f.mode); err != nil {
			return nil, err
		}
	}
	if o.placeholder {
		t.file(image.AgentPath, 0o755, 0, 0, []byte(placeholderAgent))
	} else if err := t.copyFile(image.AgentPath, o.agent, 0o755); err != nil {
		return nil, err
	}
	if o.init != "" {
		if err := t.copyFile(image.InitPath, o.init, 0o755); err != nil {
			return nil, err
		}
	}
	t.symlink(image.AgentAlias, filepath.Base(image.AgentPath))
	for _, d := range proxyDirs {
		t.dir(d, 0o755, proxyUID, proxyGID)
	}
	return t, nil
}

func layerOf(t *tree) (v1.Layer, error) {
	b, err := t.tar()
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
}

// configure sets what Dockerfile.proxyv2 sets (ENTRYPOINT, WORKDIR, the
// environment), plus USER istio-proxy: Istio's image leaves the user to the
// injector's securityContext (runAsUser 1337 for the proxy, 0 for
// istio-init), ours also runs as istio-proxy where nothing says otherwise.
func configure(img v1.Image, o *options) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.Entrypoint = []string{image.AgentPath}
	cf.Config.Cmd = nil
	cf.Config.WorkingDir = "/"
	cf.Config.User = fmt.Sprintf("%d:%d", proxyUID, proxyGID)
	cf.Config.Env = append([]string{"PATH=" + path}, o.env...)
	cf.Config.Labels = map[string]string{}
	for _, kv := range o.labels {
		k, v, _ := strings.Cut(kv, "=")
		cf.Config.Labels[k] = v
	}
	return mutate.ConfigFile(img, cf)
}
