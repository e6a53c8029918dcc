// Package image builds the sidecar image a user runs: meshagent layered onto
// Istio's own proxyv2 image, pulled from the user's registry, without a
// container daemon (#32). The base keeps everything it has (Istio's Envoy,
// user, command, environment, labels); one layer is appended that puts
// meshagent at /usr/local/bin/pilot-agent, where Istio's injector, hooks and
// tools find Istio's agent, with its init beside it; labels name both
// versions. The entrypoint alone changes (#36): Istio's, the agent, becomes
// meshagent-init in front of the agent, so that a pod starts the agent's
// large binary once (layer.go, entrypoint).
//
// A base is checked before anything is written: it must be an image (or an
// index of images) with proxyv2's shape and every platform asked for, and
// every platform needs a meshagent binary built for it. A multi-platform
// base gives a multi-platform result, each platform with its own agent. The
// whole result is built (and its new layers hashed) before the first byte is
// pushed, so a bad base or a missing binary pushes nothing.
//
// `make image` builds the stand-in image of the test suites through the same
// code: hack/mkimage lays out a proxyv2-shaped base around the stand-in
// Envoy, and Build layers meshagent onto it.
package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Errors a caller can tell apart with errors.Is; each is wrapped with the
// base, platform or path it is about.
var (
	// ErrBase: the base could not be read (no such reference, registry
	// unreachable, not a tarball or layout).
	ErrBase = errors.New("cannot read the base")
	// ErrNotImage: the base is something else than an image or an index of
	// images (a Helm chart, a signature, a bare blob).
	ErrNotImage = errors.New("the base is not a container image")
	// ErrNotProxyv2: the base lacks a file of Istio's proxyv2 image.
	ErrNotProxyv2 = errors.New("the base is not Istio's proxyv2")
	// ErrPlatform: a platform asked for is not in the base, or the base has
	// no platform to build.
	ErrPlatform = errors.New("platform not in the base")
	// ErrNoAgent: a platform of the result has no meshagent binary, or the
	// binary given is not one for that platform.
	ErrNoAgent = errors.New("no meshagent binary for the platform")
	// ErrOutput: the destination is not a valid reference or file.
	ErrOutput = errors.New("bad destination")
)

// Binaries are one platform's meshagent and its init (host paths).
type Binaries struct {
	Agent, Init string
}

// BinariesBeside are agent and the init found beside it, as the agent looks
// for its init beside itself.
func BinariesBeside(agent string) Binaries {
	return Binaries{Agent: agent, Init: filepath.Join(filepath.Dir(agent), InitName)}
}

// Options are one build.
type Options struct {
	// Base is a registry reference (docker.io/istio/proxyv2:1.28.1), or a
	// local base: a docker-archive tarball ("tarball:PATH", or the path of
	// an existing file) or an OCI image layout ("oci:DIR", or an existing
	// directory).
	Base string
	// Push is the reference the result is pushed to; Output the file it is
	// written to instead (a docker-archive tarball for one platform, an OCI
	// image layout archive for several; both load with `ctr images import`
	// and `docker load`). Exactly one is set.
	Push, Output string
	// Tag names the image inside Output (default: meshagent-proxyv2:VERSION).
	Tag string
	// Platforms are the platforms to build ("linux/arm64"); none: every
	// platform of the base.
	Platforms []string
	// Agents are each platform's binaries, keyed "os/arch[/variant]".
	Agents map[string]Binaries
	// Version is meshagent's, for the label.
	Version string
	// Labels are extra labels (`make image` names the stand-in Envoy).
	Labels map[string]string
	// Keychain finds registry credentials (default authn.DefaultKeychain:
	// docker's config.json, as `docker login` writes it).
	Keychain authn.Keychain
	// Insecure speaks plain HTTP to the registries named (a test registry
	// with a public name; loopback and private addresses need not say).
	Insecure bool
	// Transport is the HTTP transport to registries (nil: the default).
	Transport http.RoundTripper
	// Progress receives what is done, one line per step; with Terminal it
	// also gets a live count of bytes, rewritten in place.
	Progress io.Writer
	Terminal bool
}

// Result is what was built.
type Result struct {
	// Digest is the pushed or written manifest's: the index's when the base
	// is an index and the result is pushed (what `crane digest` and the
	// registry say), the image's in a docker-archive.
	Digest v1.Hash
	// Platforms are the platforms built.
	Platforms []string
}

// OwnPlatform is the platform of the running binary.
func OwnPlatform() string { return runtime.GOOS + "/" + runtime.GOARCH }

// Build checks the base, layers meshagent onto each platform of it, then
// pushes or writes the result.
func Build(ctx context.Context, o Options) (Result, error) {
	if o.Keychain == nil {
		o.Keychain = authn.DefaultKeychain
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	dest, err := o.destination()
	if err != nil {
		return Result{}, err
	}
	cacheDir, err := os.MkdirTemp("", "meshagent-image-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(cacheDir)
	p := &progress{w: o.Progress, terminal: o.Terminal}

	b, err := o.openBase(ctx, cacheDir)
	if err != nil {
		return Result{}, err
	}
	platforms, err := b.platforms(o.Platforms)
	if err != nil {
		return Result{}, err
	}
	// Every binary before any download: a missing one is found at once.
	bins := map[string]Binaries{}
	for _, pl := range platforms {
		if bins[pl], err = o.binaries(pl); err != nil {
			return Result{}, err
		}
	}
	built := map[string]v1.Image{}
	for _, pl := range platforms {
		base := b.images[pl]
		if err := checkShape(base, o.Base, pl, p); err != nil {
			return Result{}, err
		}
		var entry string
		if built[pl], entry, err = o.layer(base, bins[pl], b); err != nil {
			return Result{}, fmt.Errorf("%s: %w", pl, err)
		}
		p.stepf("%s: meshagent layered onto %s (%s); %s", pl, o.Base, bins[pl].Agent, entry)
	}
	result, err := assemble(b, platforms, built)
	if err != nil {
		return Result{}, err
	}
	digest, err := dest.write(ctx, result, o, p)
	if err != nil {
		return Result{}, err
	}
	return Result{Digest: digest, Platforms: platforms}, nil
}

// binaries are platform pl's, checked: both files exist and the agent is
// built for pl.
func (o Options) binaries(pl string) (Binaries, error) {
	b, ok := o.Agents[pl]
	if !ok {
		given := slices.Sorted(maps.Keys(o.Agents))
		return Binaries{}, fmt.Errorf("%w %s: give --agent %s=PATH (`make build-%s` cross-builds it); binaries given for %s",
			ErrNoAgent, pl, pl, strings.ReplaceAll(pl, "/", "-"), orNone(given))
	}
	if err := checkBinary(b.Agent, pl); err != nil {
		return Binaries{}, fmt.Errorf("%w %s: the agent %w", ErrNoAgent, pl, err)
	}
	if err := checkBinary(b.Init, pl); err != nil {
		return Binaries{}, fmt.Errorf("%w %s: its init (%s, found beside the agent) %w", ErrNoAgent, pl, InitName, err)
	}
	return b, nil
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// destination is where the result goes.
type destination struct {
	push name.Reference // or
	file string
	tag  name.Tag // the name inside file
}

func (o Options) destination() (destination, error) {
	switch {
	case (o.Push == "") == (o.Output == ""):
		return destination{}, fmt.Errorf("%w: give exactly one of --push REF and -o FILE", ErrOutput)
	case o.Push != "":
		ref, err := name.ParseReference(o.Push, o.nameOptions()...)
		if err != nil {
			return destination{}, fmt.Errorf("%w: --push %q: %w", ErrOutput, o.Push, err)
		}
		return destination{push: ref}, nil
	}
	tag := o.Tag
	if tag == "" {
		tag = "meshagent-proxyv2:" + sanitizeTag(o.Version)
	}
	t, err := name.NewTag(tag)
	if err != nil {
		return destination{}, fmt.Errorf("%w: --tag %q: %w", ErrOutput, tag, err)
	}
	return destination{file: o.Output, tag: t}, nil
}

// sanitizeTag makes a version a valid tag ([A-Za-z0-9_.-], 128 at most).
func sanitizeTag(v string) string {
	b := []byte(v)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "dev"
	}
	return string(b[:min(len(b), 128)])
}
