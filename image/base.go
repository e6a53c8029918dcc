package image

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/cache"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// base is the image or index a build starts from, its images by platform.
type base struct {
	given  string                   // as the user named it
	digest v1.Hash                  // the manifest's (the index's for several platforms)
	tag    string                   // the reference's tag, if any
	index  v1.ImageIndex            // nil for a single image
	images map[string]v1.Image      // by platform ("linux/arm64")
	descs  map[string]v1.Descriptor // each image's descriptor in index
	order  []string                 // platforms as the base lists them
}

// openBase reads the manifests of the base (no layer yet). Layers of a
// registry base go through a cache in cacheDir, so that each is downloaded
// once: for the shape check, then read back when the result is pushed.
func (o Options) openBase(ctx context.Context, cacheDir string) (*base, error) {
	b := &base{given: o.Base, images: map[string]v1.Image{}, descs: map[string]v1.Descriptor{}}
	var img v1.Image
	var err error
	switch kind, p := localBase(o.Base); kind {
	case "tarball":
		if img, err = tarball.ImageFromPath(p, nil); err != nil {
			return nil, fmt.Errorf("%w %s: not a docker-archive tarball with one image: %w", ErrBase, o.Base, err)
		}
	case "oci":
		if b.index, err = layout.ImageIndexFromPath(p); err != nil {
			return nil, fmt.Errorf("%w %s: not an OCI image layout: %w", ErrBase, o.Base, err)
		}
		if b.index, img, err = unwrapLayout(b.index); err != nil {
			return nil, fmt.Errorf("%w %s: %w", ErrNotImage, o.Base, err)
		}
	default:
		ref, err := name.ParseReference(o.Base, o.nameOptions()...)
		if err != nil {
			return nil, fmt.Errorf("%w: --base %q is neither a reference nor an existing file: %w", ErrBase, o.Base, err)
		}
		if t, ok := ref.(name.Tag); ok {
			b.tag = t.TagStr()
		}
		desc, err := remote.Get(ref, o.remoteOptions(ctx)...)
		if err != nil {
			return nil, fmt.Errorf("%w %s: %w", ErrBase, o.Base, err)
		}
		switch {
		case desc.MediaType.IsIndex():
			b.index, err = desc.ImageIndex()
		case desc.MediaType.IsImage():
			img, err = desc.Image()
		default:
			return nil, fmt.Errorf("%w: %s is a %s", ErrNotImage, o.Base, desc.MediaType)
		}
		if err != nil {
			return nil, fmt.Errorf("%w %s: %w", ErrBase, o.Base, err)
		}
		c := cache.NewFilesystemCache(cacheDir)
		if img != nil {
			img = cache.Image(img, c)
		} else {
			b.index = cachedIndex{remoteIndex: b.index, c: c}
		}
	}
	if img != nil {
		return b, b.addImage(img)
	}
	return b, b.addIndex()
}

// localBase says whether base names a local file: "tarball:PATH", "oci:DIR",
// or the path of an existing file or directory.
func localBase(s string) (kind, path string) {
	if p, ok := strings.CutPrefix(s, "tarball:"); ok {
		return "tarball", p
	}
	if p, ok := strings.CutPrefix(s, "oci:"); ok {
		return "oci", p
	}
	if fi, err := os.Stat(s); err == nil {
		if fi.IsDir() {
			return "oci", s
		}
		return "tarball", s
	}
	return "", ""
}

// unwrapLayout is the image or index an OCI layout's index.json points at
// when it points at one only (as `crane pull --format=oci` writes).
func unwrapLayout(idx v1.ImageIndex) (v1.ImageIndex, v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, nil, err
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Platform != nil {
		return idx, nil, nil
	}
	d := m.Manifests[0]
	switch {
	case d.MediaType.IsIndex():
		child, err := idx.ImageIndex(d.Digest)
		return child, nil, err
	case d.MediaType.IsImage():
		img, err := idx.Image(d.Digest)
		return nil, img, err
	}
	return nil, nil, fmt.Errorf("its index holds a %s", d.MediaType)
}

// addImage records a single-platform base, by the platform in its config.
func (b *base) addImage(img v1.Image) error {
	if err := checkConfigType(img, b.given); err != nil {
		return err
	}
	d, err := img.Digest()
	if err != nil {
		return fmt.Errorf("%w %s: %w", ErrBase, b.given, err)
	}
	b.digest = d
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("%w %s: its config: %w", ErrBase, b.given, err)
	}
	pl := platformKey(v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant})
	b.images[pl] = img
	b.order = []string{pl}
	return nil
}

// addIndex records each image of a multi-platform base. Entries that are no
// platform's image (attestations, "unknown/unknown") are left out.
func (b *base) addIndex() error {
	d, err := b.index.Digest()
	if err != nil {
		return fmt.Errorf("%w %s: %w", ErrBase, b.given, err)
	}
	b.digest = d
	m, err := b.index.IndexManifest()
	if err != nil {
		return fmt.Errorf("%w %s: %w", ErrBase, b.given, err)
	}
	for _, desc := range m.Manifests {
		if !desc.MediaType.IsImage() || desc.Platform == nil || desc.Platform.OS == "unknown" {
			continue
		}
		pl := platformKey(*desc.Platform)
		if _, dup := b.images[pl]; dup {
			continue
		}
		img, err := b.index.Image(desc.Digest)
		if err != nil {
			return fmt.Errorf("%w %s (%s): %w", ErrBase, b.given, pl, err)
		}
		if err := checkConfigType(img, b.given); err != nil {
			return err
		}
		b.images[pl], b.descs[pl] = img, desc
		b.order = append(b.order, pl)
	}
	if len(b.order) == 0 {
		return fmt.Errorf("%w: %s is an index of no platform's image", ErrNotImage, b.given)
	}
	return nil
}

// checkConfigType refuses artifacts stored as image manifests (a Helm
// chart, a signature): their config is not a container image's.
func checkConfigType(img v1.Image, given string) error {
	m, err := img.Manifest()
	if err != nil {
		return fmt.Errorf("%w %s: %w", ErrBase, given, err)
	}
	if mt := m.Config.MediaType; mt != types.DockerConfigJSON && mt != types.OCIConfigJSON {
		return fmt.Errorf("%w: %s has a config of type %s", ErrNotImage, given, mt)
	}
	return nil
}

// platforms are those to build: asked, each of which the base must have,
// or else all of the base's.
func (b *base) platforms(asked []string) ([]string, error) {
	if len(asked) == 0 {
		return b.order, nil
	}
	var out []string
	for _, a := range asked {
		p, err := v1.ParsePlatform(a)
		if err != nil {
			return nil, fmt.Errorf("%w: --platform %q: %w", ErrPlatform, a, err)
		}
		key := platformKey(*p)
		if _, ok := b.images[key]; !ok {
			return nil, fmt.Errorf("%w: %s has no %s (it has %s)", ErrPlatform, b.given, key, strings.Join(b.order, ", "))
		}
		if !slices.Contains(out, key) {
			out = append(out, key)
		}
	}
	return out, nil
}

// platformKey is "os/arch", with the variant only where it tells binaries
// apart (arm/v6, arm/v7): linux/arm64/v8 is linux/arm64, as --agent names it.
func platformKey(p v1.Platform) string {
	k := p.OS + "/" + p.Architecture
	if p.Architecture == "arm" && p.Variant != "" {
		k += "/" + p.Variant
	}
	return k
}

// NormalizePlatform is a platform as --platform and --agent keys compare.
func NormalizePlatform(s string) (string, error) {
	p, err := v1.ParsePlatform(s)
	if err != nil {
		return "", err
	}
	if p.OS == "" || p.Architecture == "" {
		return "", fmt.Errorf("%q: want OS/ARCH (linux/arm64)", s)
	}
	return platformKey(*p), nil
}

// cachedIndex is a registry index whose images' layers go through a cache.
// (The embedded interface is named by a type of its own: ImageIndex is
// also one of its methods.)
type cachedIndex struct {
	remoteIndex
	c cache.Cache
}

type remoteIndex = v1.ImageIndex

func (i cachedIndex) Image(h v1.Hash) (v1.Image, error) {
	img, err := i.remoteIndex.Image(h)
	if err != nil {
		return nil, err
	}
	return cache.Image(img, i.c), nil
}

// nameOptions: with Insecure, registries are spoken to over plain HTTP
// (go-containerregistry already does for localhost and private addresses).
func (o Options) nameOptions() []name.Option {
	if o.Insecure {
		return []name.Option{name.Insecure}
	}
	return nil
}

func (o Options) remoteOptions(ctx context.Context) []remote.Option {
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(o.Keychain)}
	if o.Transport != nil {
		opts = append(opts, remote.WithTransport(o.Transport))
	}
	return opts
}
