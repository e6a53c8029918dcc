// Package wasmserver serves Wasm modules on loopback for the tests of the
// agent's Wasm fetch (#35): an OCI registry (go-containerregistry's) holding
// modules in Istio's two image layouts, and an HTTP server that can be
// slow, fail, or serve the wrong bytes. Both count what they serve.
package wasmserver

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Module is the smallest valid Wasm module: the magic number and version 1.
var Module = []byte("\x00asm\x01\x00\x00\x00")

// ModuleWith is a valid module that differs from Module by a custom
// section named tag: modules told apart by their checksum.
func ModuleWith(tag string) []byte {
	body := append([]byte{byte(len(tag))}, tag...)
	return append(append(bytes.Clone(Module), 0, byte(len(body))), body...)
}

// Sum is a module's sha256, hex, as a WasmPlugin's sha256 names it.
func Sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Layout is how an image holds its module (Istio's pkg/wasm/imagefetcher.go).
type Layout int

const (
	// Artifact: the Wasm OCI artifact, two layers, one of them the module
	// of type application/vnd.module.wasm.content.layer.v1+wasm.
	Artifact Layout = iota
	// DockerCompat: a Docker image whose last layer holds plugin.wasm.
	DockerCompat
	// OCICompat: the same as an OCI image.
	OCICompat
)

// Registry is an OCI registry on loopback.
type Registry struct {
	srv *httptest.Server
	// Manifests counts manifest requests (GET or HEAD), Blobs blob GETs.
	Manifests, Blobs atomic.Int64
}

// RegistryOptions configure a Registry.
type RegistryOptions struct {
	// User and Password, when set, are required (HTTP basic auth).
	User, Password string
	// TLS serves HTTPS with httptest's self-signed certificate.
	TLS bool
	// Bearer answers every request 401 with a bearer challenge whose realm
	// is this URL.
	Bearer string
}

// NewRegistry starts a registry, closed at the end of the test.
func NewRegistry(t testing.TB, o RegistryOptions) *Registry {
	t.Helper()
	r := &Registry{}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	h := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if o.Bearer != "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+o.Bearer+`",service="registry"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if o.User != "" {
			u, p, ok := req.BasicAuth()
			if !ok || u != o.User || p != o.Password {
				w.Header().Set("WWW-Authenticate", `Basic realm="registry"`)
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
		}
		switch {
		case strings.Contains(req.URL.Path, "/manifests/"):
			r.Manifests.Add(1)
		case strings.Contains(req.URL.Path, "/blobs/") && req.Method == http.MethodGet:
			r.Blobs.Add(1)
		}
		inner.ServeHTTP(w, req)
	})
	if o.TLS {
		r.srv = httptest.NewTLSServer(h)
	} else {
		r.srv = httptest.NewServer(h)
	}
	t.Cleanup(r.srv.Close)
	return r
}

// Host is the registry's host:port.
func (r *Registry) Host() string { return r.srv.Listener.Addr().String() }

// Push stores module at repo:tag in layout, with the registry's
// credentials when it has any, and returns the image's manifest digest
// (hex), which names the module in the agent's cache.
func (r *Registry) Push(t testing.TB, repo, tag string, layout Layout, module []byte, o RegistryOptions) string {
	t.Helper()
	return r.PushImage(t, repo, tag, Image(t, layout, module), o)
}

// PushImage stores img at repo:tag, as Push does, for a test that builds
// an image of its own (a hostile layer).
func (r *Registry) PushImage(t testing.TB, repo, tag string, img v1.Image, o RegistryOptions) string {
	t.Helper()
	opts := []name.Option{}
	if !o.TLS {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(r.Host()+"/"+repo+":"+tag, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ropts := []remote.Option{remote.WithTransport(r.srv.Client().Transport)}
	if o.User != "" {
		ropts = append(ropts, remote.WithAuth(&authn.Basic{Username: o.User, Password: o.Password}))
	}
	if err := remote.Write(ref, img, ropts...); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.Hex
}

// Image is module in layout.
func Image(t testing.TB, layout Layout, module []byte) v1.Image {
	t.Helper()
	var img v1.Image
	var err error
	switch layout {
	case Artifact:
		base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), "application/vnd.module.wasm.config.v1+json")
		img, err = mutate.Append(base,
			mutate.Addendum{Layer: static.NewLayer([]byte(`{}`), "application/vnd.module.wasm.config.v1+json")},
			mutate.Addendum{Layer: static.NewLayer(module, "application/vnd.module.wasm.content.layer.v1+wasm")})
	case DockerCompat:
		img, err = mutate.AppendLayers(empty.Image, static.NewLayer(TarGz(t, "plugin.wasm", module), types.DockerLayer))
	case OCICompat:
		base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		img, err = mutate.AppendLayers(base, static.NewLayer(TarGz(t, "plugin.wasm", module), types.OCILayer))
	}
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TarGz is a tar.gz holding one file.
func TarGz(t testing.TB, file string, content []byte) []byte {
	t.Helper()
	return TarGzFiles(t, File{file, content})
}

// File is a file of a tar.
type File struct {
	Name    string
	Content []byte
}

// TarGzFiles is a tar.gz holding files, in order.
func TarGzFiles(t testing.TB, files ...File) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.Name, Mode: 0o644, Size: int64(len(f.Content)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.Content); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// PullSecret is a .dockerconfigjson for host, as istiod passes a
// WasmPlugin's imagePullSecret.
func PullSecret(host, user, pass string) string {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{"auth": auth}}})
	return string(b)
}

// HTTP is a server of modules by path.
type HTTP struct {
	srv *httptest.Server
	mu  sync.Mutex
	h   map[string]http.HandlerFunc
	// reqs counts the requests by path; abandoned, those held that the
	// client gave up on.
	reqs, abandoned map[string]int
}

// NewHTTP starts an HTTP server, closed at the end of the test.
func NewHTTP(t testing.TB) *HTTP {
	t.Helper()
	s := &HTTP{h: map[string]http.HandlerFunc{}, reqs: map[string]int{}, abandoned: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs[r.URL.Path]++
		h := s.h[r.URL.Path]
		s.mu.Unlock()
		if h == nil {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// Handle serves path with h; Serve serves b there.
func (s *HTTP) Handle(path string, h http.HandlerFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.h[path] = h
}

func (s *HTTP) Serve(path string, b []byte) {
	s.Handle(path, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(b) })
}

// FailThenServe answers path fails times with code, then with b.
func (s *HTTP) FailThenServe(path string, fails, code int, b []byte) {
	var n atomic.Int64
	s.Handle(path, func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1) <= int64(fails) {
			w.WriteHeader(code)
			return
		}
		_, _ = w.Write(b)
	})
}

// Hold answers path only once release is closed, then with b; a client
// that gives up first is counted (Abandoned).
func (s *HTTP) Hold(path string, release <-chan struct{}, b []byte) {
	s.Handle(path, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
			_, _ = w.Write(b)
		case <-r.Context().Done():
			s.mu.Lock()
			s.abandoned[path]++
			s.mu.Unlock()
		}
	})
}

// Abandoned is how many requests for path the client gave up on while
// they were held.
func (s *HTTP) Abandoned(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.abandoned[path]
}

// URL is the server's URL for path.
func (s *HTTP) URL(path string) string { return s.srv.URL + path }

// Requests is how many requests path received.
func (s *HTTP) Requests(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reqs[path]
}
