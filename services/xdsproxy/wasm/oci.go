package wasm

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Istio's image layouts for a Wasm module (pkg/wasm/imagefetcher.go, after
// solo-io's Wasm image specification):
//   - the Wasm OCI artifact: two layers, one of them the module itself,
//     uncompressed, of wasmLayerType;
//   - the compat image: its last layer a tar.gz (Docker's or OCI's layer
//     type) holding plugin.wasm.
const (
	wasmLayerType  = types.MediaType("application/vnd.module.wasm.content.layer.v1+wasm")
	compatFileName = "plugin.wasm"
)

// ociImage is a module's image, resolved: its manifest digest (the
// module's checksum in the cache, as Istio's) and how to read the module.
type ociImage struct {
	digest string // hex sha256 of the manifest
	img    v1.Image
	max    int64
}

// resolveOCI fetches the manifest of ref (host/repo:tag or @digest): with
// the pull secret (a .dockerconfigjson) when given, else the default
// keychain (DOCKER_CONFIG); insecure skips certificate checks. A registry
// that answers plain HTTP is asked again over HTTP, as Istio does.
func resolveOCI(ctx context.Context, ref string, pullSecret []byte, insecure bool, max int64) (*ociImage, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("could not parse url in image reference: %w", err)
	}
	var kc authn.Keychain = authn.DefaultKeychain
	if pullSecret != nil {
		kc = dockerConfigKeychain(pullSecret)
	}
	var t http.RoundTripper = remote.DefaultTransport
	if insecure {
		it := remote.DefaultTransport.(*http.Transport).Clone()
		// Only for the hosts the operator named (WASM_INSECURE_REGISTRIES).
		it.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec
		t = it
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc), remote.WithTransport(realmGuard{t})}
	desc, err := remote.Get(r, opts...)
	if err != nil && strings.Contains(err.Error(), "server gave HTTP response") {
		if r, err = name.ParseReference(ref, name.Insecure); err == nil {
			desc, err = remote.Get(r, opts...)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("could not fetch manifest: %w", err)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, fmt.Errorf("could not fetch image: %w", err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("could not digest the manifest: %w", err)
	}
	return &ociImage{digest: d.Hex, img: img, max: max}, nil
}

// module reads the module out of the image, in whichever of Istio's
// layouts it is.
func (o *ociImage) module() ([]byte, error) {
	m, err := o.img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("could not retrieve manifest: %w", err)
	}
	layers, err := o.img.Layers()
	if err != nil {
		return nil, fmt.Errorf("could not fetch layers: %w", err)
	}
	if m.MediaType == types.DockerManifestSchema2 {
		b, err := o.compat(layers, types.DockerLayer)
		if err != nil {
			return nil, fmt.Errorf("could not extract Wasm file from the image as Docker container: %w", err)
		}
		return b, nil
	}
	b, errCompat := o.compat(layers, types.OCILayer)
	if errCompat == nil {
		return b, nil
	}
	b, errArtifact := o.artifact(layers)
	if errArtifact == nil {
		return b, nil
	}
	return nil, fmt.Errorf("the given image is in invalid format as an OCI image: compat variant: %w; oci variant: %w", errCompat, errArtifact)
}

// compat: the last layer, of type want, is a tar.gz holding plugin.wasm.
func (o *ociImage) compat(layers []v1.Layer, want types.MediaType) ([]byte, error) {
	if len(layers) == 0 {
		return nil, errors.New("number of layers must be greater than zero")
	}
	l := layers[len(layers)-1]
	if mt, err := l.MediaType(); err != nil || mt != want {
		return nil, fmt.Errorf("invalid media type %s (expect %s)", mt, want)
	}
	rc, err := o.open(l)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	// Both sides of the gzip are bounded, each an ErrTooLarge naming its
	// bound rather than a silent cut (#33): the compressed layer, and the
	// bytes decompressed from it, which the tar reader reads to skip the
	// files before plugin.wasm. A small gzip of zeros would otherwise
	// decompress for as long as the fetch's timeout lets it. A compat
	// layer holds the module and a few headers; twice the module's bound
	// leaves room for a layer with other small files.
	zr, err := gzip.NewReader(newBoundedReader(rc, o.max, "the layer"))
	if err != nil {
		if errors.Is(err, ErrTooLarge) {
			return nil, err
		}
		return nil, fmt.Errorf("failed to parse layer as tar.gz: %w", err)
	}
	tr := tar.NewReader(newBoundedReader(zr, 2*o.max, "the layer's decompressed content"))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s not found in the archive", compatFileName)
		}
		if err != nil {
			return nil, err
		}
		if path.Base(h.Name) != compatFileName {
			continue
		}
		if h.Size > o.max {
			return nil, fmt.Errorf("%w: %s is %d bytes", ErrTooLarge, h.Name, h.Size)
		}
		return readBounded(tr, o.max)
	}
}

// artifact: two layers, one of them the module of wasmLayerType.
func (o *ociImage) artifact(layers []v1.Layer) ([]byte, error) {
	if len(layers) != 2 {
		return nil, fmt.Errorf("number of layers must be 2 but got %d", len(layers))
	}
	for _, l := range layers {
		if mt, err := l.MediaType(); err != nil || mt != wasmLayerType {
			continue
		}
		// Compressed: the layer is the module as it is, which
		// go-containerregistry would try to gunzip as Uncompressed.
		rc, err := o.open(l)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		return readBounded(rc, o.max)
	}
	return nil, fmt.Errorf("could not find the layer of type %s", wasmLayerType)
}

// open reads a layer as stored, refusing one the manifest says is past
// the bound before downloading it.
func (o *ociImage) open(l v1.Layer) (io.ReadCloser, error) {
	if n, err := l.Size(); err == nil && n > o.max {
		return nil, fmt.Errorf("%w: a layer of %d bytes", ErrTooLarge, n)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("could not get layer content: %w", err)
	}
	return rc, nil
}

// dockerConfigKeychain resolves a registry's credentials from a pull
// secret's .dockerconfigjson ({"auths": {"host": {"auth": base64(user:pass)}}}),
// matching hosts as Docker's config file does: a key may carry a scheme and
// a path, and Docker Hub's key is its v1 URL. A registry without an entry
// is pulled anonymously.
type dockerConfigKeychain []byte

type dockerAuth struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

func (k dockerConfigKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	var cfg struct {
		Auths map[string]dockerAuth `json:"auths"`
	}
	if err := json.Unmarshal(k, &cfg); err != nil {
		return nil, fmt.Errorf("the image pull secret is not a .dockerconfigjson: %w", err)
	}
	want := target.RegistryStr()
	if want == name.DefaultRegistry {
		want = authn.DefaultAuthKey
	}
	for key, a := range cfg.Auths {
		if key != want && registryHost(key) != registryHost(want) {
			continue
		}
		if a.Auth != "" {
			dec, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, fmt.Errorf("the image pull secret's auth for %s is not base64: %w", key, err)
			}
			user, pass, ok := strings.Cut(string(dec), ":")
			if !ok {
				return nil, fmt.Errorf("the image pull secret's auth for %s is not user:password", key)
			}
			a.Username, a.Password = user, pass
		}
		return authn.FromConfig(authn.AuthConfig{Username: a.Username, Password: a.Password,
			IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}), nil
	}
	return authn.Anonymous, nil
}

// registryHost is a config key's host: "https://index.docker.io/v1/" is
// index.docker.io.
func registryHost(key string) string {
	if u, err := url.Parse(key); err == nil && u.Host != "" {
		return u.Host
	}
	h, _, _ := strings.Cut(key, "/")
	return h
}

// realmGuard refuses a registry's 401 whose bearer realm points the token
// request at a private, loopback or link-local address, or a metadata
// service: a registry must not make the agent call into the pod's network
// (Istio's ssrfProtectionTransport).
type realmGuard struct{ inner http.RoundTripper }

func (g realmGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := g.inner.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	for _, h := range resp.Header.Values("WWW-Authenticate") {
		// Bearer challenges only: Istio's guard reads the realm of a
		// Basic challenge too ("Registry Realm", not a URL) and so
		// refuses every registry with basic auth.
		if !strings.HasPrefix(strings.ToLower(strings.TrimSpace(h)), "bearer") {
			continue
		}
		if err := checkRealms(h); err != nil {
			resp.Body.Close()
			return nil, fmt.Errorf("rejected unsafe bearer realm: %w", err)
		}
	}
	return resp, nil
}

func checkRealms(h string) error {
	for {
		i := strings.Index(h, `realm="`)
		if i < 0 {
			return nil
		}
		h = h[i+len(`realm="`):]
		j := strings.IndexByte(h, '"')
		if j < 0 {
			return nil
		}
		realm := h[:j]
		h = h[j+1:]
		u, err := url.Parse(realm)
		if err != nil {
			return fmt.Errorf("invalid realm URL: %w", err)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return fmt.Errorf("realm scheme %q not allowed", u.Scheme)
		}
		host := u.Hostname()
		switch host {
		case "":
			return errors.New("realm missing host")
		case "metadata.google.internal":
			return errors.New("realm targets cloud metadata service")
		case "localhost":
			return errors.New("realm targets localhost")
		}
		if ip := net.ParseIP(host); ip != nil && (ip.IsPrivate() || ip.IsLoopback() || ip.IsLinkLocalUnicast()) {
			return errors.New("realm targets private/loopback/link-local IP")
		}
	}
}
