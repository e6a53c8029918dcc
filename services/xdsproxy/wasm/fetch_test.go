package wasm

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/wasmserver"
)

// testConfig is the fetch's config with the env table's values and the
// modules in dir, retried without a pause.
func testConfig(t testing.TB, dir string) Config {
	cfg := Config{Dir: dir, RetryBackoff: time.Millisecond}
	testkit.FillFromTable(t, &cfg)
	return cfg
}

// startCache is a running cache in a fresh directory; edit changes its
// config first. It stops at the end of the test.
func startCache(t *testing.T, clock messages.Clock, edit ...func(*Config)) (*Cache, Config) {
	t.Helper()
	cfg := testConfig(t, filepath.Join(t.TempDir(), "data"))
	for _, e := range edit {
		e(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := NewCache(cfg, clock, testkit.NewLogBuffer(t).Logger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return c, c.cfg
}

func ctxOf(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// wantModule: path is a file in the cache directory holding module.
func wantModule(t *testing.T, cfg Config, path string, module []byte) {
	t.Helper()
	if !strings.HasPrefix(path, cfg.Dir+"/") {
		t.Errorf("module path %q is not under the cache directory %q", path, cfg.Dir)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != string(module) {
		t.Errorf("module file holds %q, want %q", b, module)
	}
}

// Every layout Istio's agent reads is read: the Wasm artifact, and the
// compat image as Docker's and as OCI's; the file is named by the image's
// manifest digest, under a directory per repository, as Istio's.
func TestOCILayouts(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir()) // no host credentials
	reg := wasmserver.NewRegistry(t, wasmserver.RegistryOptions{})
	for _, tc := range []struct {
		name   string
		layout wasmserver.Layout
	}{{"artifact", wasmserver.Artifact}, {"docker-compat", wasmserver.DockerCompat}, {"oci-compat", wasmserver.OCICompat}} {
		t.Run(tc.name, func(t *testing.T) {
			c, cfg := startCache(t, nil)
			module := wasmserver.ModuleWith(tc.name)
			digest := reg.Push(t, "plugins/"+tc.name, "v1", tc.layout, module, wasmserver.RegistryOptions{})
			path, err := c.Get(ctxOf(t), "oci://"+reg.Host()+"/plugins/"+tc.name+":v1", GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			wantModule(t, cfg, path, module)
			if filepath.Base(path) != digest+".wasm" {
				t.Errorf("module file %s, want it named by the manifest digest %s", filepath.Base(path), digest)
			}
			// By digest, with the digest as the checksum: the cached copy.
			before := reg.Manifests.Load()
			again, err := c.Get(ctxOf(t), "oci://"+reg.Host()+"/plugins/"+tc.name+"@sha256:"+digest, GetOptions{})
			if err != nil || again != path {
				t.Errorf("by digest: %q, %v; want the cached %q", again, err, path)
			}
			if n := reg.Manifests.Load() - before; n != 0 {
				t.Errorf("the registry was asked %d more times for a module the cache holds", n)
			}
			// A checksum that is not the image's fails.
			_, err = c.Get(ctxOf(t), "oci://"+reg.Host()+"/plugins/"+tc.name+":v1", GetOptions{Checksum: wasmserver.Sum([]byte("other"))})
			if err == nil || !strings.Contains(err.Error(), "does not match") {
				t.Errorf("wrong checksum: %v, want a mismatch", err)
			}
		})
	}
}

// An image that is not a Wasm module in any layout is refused, saying so.
func TestOCINotAModule(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	reg := wasmserver.NewRegistry(t, wasmserver.RegistryOptions{})
	reg.Push(t, "plugins/bad", "v1", wasmserver.OCICompat, []byte("not wasm at all"), wasmserver.RegistryOptions{})
	c, _ := startCache(t, nil)
	_, err := c.Get(ctxOf(t), "oci://"+reg.Host()+"/plugins/bad:v1", GetOptions{})
	if err == nil || !strings.Contains(err.Error(), "invalid") {
		t.Fatalf("got %v, want the module refused as invalid", err)
	}
}

// The pod's pull secret (a .dockerconfigjson in the VM's environment)
// authenticates to the registry; without it, or with a wrong password, the
// fetch fails.
func TestOCIPullSecret(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	o := wasmserver.RegistryOptions{User: "puller", Password: "s3cret"}
	reg := wasmserver.NewRegistry(t, o)
	reg.Push(t, "private/plugin", "v1", wasmserver.Artifact, wasmserver.Module, o)
	url := "oci://" + reg.Host() + "/private/plugin:v1"

	c, cfg := startCache(t, nil)
	if _, err := c.Get(ctxOf(t), url, GetOptions{}); err == nil {
		t.Error("fetched from a registry that needs credentials without any")
	}
	if _, err := c.Get(ctxOf(t), url, GetOptions{PullSecret: []byte(wasmserver.PullSecret(reg.Host(), "puller", "wrong"))}); err == nil {
		t.Error("fetched with a wrong password")
	}
	if _, err := c.Get(ctxOf(t), url, GetOptions{PullSecret: []byte("{not json")}); err == nil {
		t.Error("a pull secret that is not a .dockerconfigjson was accepted")
	}
	path, err := c.Get(ctxOf(t), url, GetOptions{PullSecret: []byte(wasmserver.PullSecret(reg.Host(), "puller", "s3cret"))})
	if err != nil {
		t.Fatal(err)
	}
	wantModule(t, cfg, path, wasmserver.Module)
}

// A registry with a certificate nobody trusts is fetched from only when
// WASM_INSECURE_REGISTRIES names it (or is "*").
func TestOCIInsecureRegistries(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	o := wasmserver.RegistryOptions{TLS: true}
	reg := wasmserver.NewRegistry(t, o)
	reg.Push(t, "plugins/tls", "v1", wasmserver.Artifact, wasmserver.Module, o)
	url := "oci://" + reg.Host() + "/plugins/tls:v1"

	c, _ := startCache(t, nil)
	if _, err := c.Get(ctxOf(t), url, GetOptions{}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("untrusted registry: %v, want a certificate error", err)
	}
	for _, insecure := range []string{reg.Host(), "*"} {
		c, cfg := startCache(t, nil, func(c *Config) { c.InsecureRegistries = []string{"other:5000", insecure} })
		path, err := c.Get(ctxOf(t), url, GetOptions{})
		if err != nil {
			t.Fatalf("WASM_INSECURE_REGISTRIES=%s: %v", insecure, err)
		}
		wantModule(t, cfg, path, wasmserver.Module)
	}
}

// A registry whose token endpoint is on a loopback or private address is
// refused before the agent calls it (Istio's SSRF guard).
func TestOCIBearerRealmGuard(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	reg := wasmserver.NewRegistry(t, wasmserver.RegistryOptions{Bearer: "http://169.254.169.254/token"})
	c, _ := startCache(t, nil)
	_, err := c.Get(ctxOf(t), "oci://"+reg.Host()+"/plugins/x:v1", GetOptions{})
	if err == nil || !strings.Contains(err.Error(), "unsafe bearer realm") {
		t.Fatalf("got %v, want the realm refused", err)
	}
}

// HTTP: the module as served, or inside a tar.gz; its sha256 checked when
// the resource names one.
func TestHTTPFetch(t *testing.T) {
	srv := wasmserver.NewHTTP(t)
	module := wasmserver.ModuleWith("http")
	srv.Serve("/plain.wasm", module)
	srv.Serve("/boxed.tar.gz", wasmserver.TarGz(t, "anything.wasm", module))
	c, cfg := startCache(t, nil)
	for _, p := range []string{"/plain.wasm", "/boxed.tar.gz"} {
		path, err := c.Get(ctxOf(t), srv.URL(p), GetOptions{Checksum: wasmserver.Sum(module)})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		wantModule(t, cfg, path, module)
	}
	_, err := c.Get(ctxOf(t), srv.URL("/plain.wasm"), GetOptions{Checksum: wasmserver.Sum([]byte("another module"))})
	if err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("wrong digest: %v, want a checksum mismatch", err)
	}
	srv.Serve("/html", []byte("<html>not a module</html>"))
	if _, err := c.Get(ctxOf(t), srv.URL("/html"), GetOptions{}); err == nil || !strings.Contains(err.Error(), "invalid") {
		t.Errorf("not a module: %v, want it refused as invalid", err)
	}
	if _, err := c.Get(ctxOf(t), "ftp://example.com/x.wasm", GetOptions{}); err == nil || !strings.Contains(err.Error(), "scheme") {
		t.Errorf("ftp: %v, want an unsupported scheme", err)
	}
}

// 5xx answers are retried, up to WASM_HTTP_REQUEST_MAX_RETRIES attempts in
// all; a 404 is not retried.
func TestHTTPRetries(t *testing.T) {
	srv := wasmserver.NewHTTP(t)
	srv.FailThenServe("/flaky.wasm", 2, http.StatusServiceUnavailable, wasmserver.Module)
	srv.FailThenServe("/down.wasm", 100, http.StatusBadGateway, wasmserver.Module)
	c, cfg := startCache(t, nil, func(c *Config) { c.HTTPRequestMaxRetries = 3 })

	path, err := c.Get(ctxOf(t), srv.URL("/flaky.wasm"), GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantModule(t, cfg, path, wasmserver.Module)
	if n := srv.Requests("/flaky.wasm"); n != 3 {
		t.Errorf("flaky: %d requests, want 3 (two failures, then the module)", n)
	}
	_, err = c.Get(ctxOf(t), srv.URL("/down.wasm"), GetOptions{})
	if err == nil || !strings.Contains(err.Error(), "after 3 attempts") || !strings.Contains(err.Error(), "502") {
		t.Errorf("down: %v, want a failure after 3 attempts naming the status", err)
	}
	if n := srv.Requests("/down.wasm"); n != 3 {
		t.Errorf("down: %d requests, want 3", n)
	}
	_, err = c.Get(ctxOf(t), srv.URL("/missing.wasm"), GetOptions{})
	if err == nil || srv.Requests("/missing.wasm") != 1 {
		t.Errorf("404: %v after %d requests, want a failure after 1", err, srv.Requests("/missing.wasm"))
	}
}

// A server that does not answer within WASM_HTTP_REQUEST_TIMEOUT fails
// the fetch.
func TestHTTPSlow(t *testing.T) {
	srv := wasmserver.NewHTTP(t)
	release := make(chan struct{})
	defer close(release)
	srv.Hold("/slow.wasm", release, wasmserver.Module)
	c, _ := startCache(t, nil, func(c *Config) { c.HTTPRequestTimeout = 50 * time.Millisecond; c.HTTPRequestMaxRetries = 2 })
	_, err := c.Get(ctxOf(t), srv.URL("/slow.wasm"), GetOptions{})
	if err == nil || !strings.Contains(err.Error(), "Timeout") {
		t.Fatalf("got %v, want a timeout", err)
	}
}

// A module past ISTIO_WASM_MAX_BINARY_SIZE_BYTES fails the fetch, from a
// server or in an image, instead of being cut off.
func TestOversizedModule(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	big := append(wasmserver.ModuleWith("big"), make([]byte, 4096)...)
	srv := wasmserver.NewHTTP(t)
	srv.Serve("/big.wasm", big)
	srv.Serve("/big.tar.gz", wasmserver.TarGz(t, "big.wasm", big))
	reg := wasmserver.NewRegistry(t, wasmserver.RegistryOptions{})
	reg.Push(t, "plugins/big", "artifact", wasmserver.Artifact, big, wasmserver.RegistryOptions{})
	reg.Push(t, "plugins/big", "compat", wasmserver.DockerCompat, big, wasmserver.RegistryOptions{})

	c, _ := startCache(t, nil, func(c *Config) { c.MaxModuleBytes = 1024 })
	for _, url := range []string{srv.URL("/big.wasm"), srv.URL("/big.tar.gz"),
		"oci://" + reg.Host() + "/plugins/big:artifact", "oci://" + reg.Host() + "/plugins/big:compat"} {
		if _, err := c.Get(ctxOf(t), url, GetOptions{}); !errors.Is(err, ErrTooLarge) {
			t.Errorf("%s: %v, want ErrTooLarge", url, err)
		}
	}
}

// A module fetched once is served from the cache (the server is not asked
// again); once unused for WASM_MODULE_EXPIRY, the next purge removes its
// file, and the next Get fetches it again.
func TestCacheReuseAndPurge(t *testing.T) {
	srv := wasmserver.NewHTTP(t)
	srv.Serve("/m.wasm", wasmserver.Module)
	clock := testkit.NewManualClock()
	c, cfg := startCache(t, clock, func(c *Config) { c.ModuleExpiry = 10 * time.Minute; c.PurgeInterval = time.Minute })

	path, err := c.Get(ctxOf(t), srv.URL("/m.wasm"), GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Get(ctxOf(t), srv.URL("/m.wasm"), GetOptions{})
	if err != nil || again != path {
		t.Fatalf("second Get: %q, %v; want %q", again, err, path)
	}
	if n := srv.Requests("/m.wasm"); n != 1 {
		t.Errorf("the server was asked %d times, want 1: the second Get is the cache's", n)
	}

	// Used within the expiry: kept.
	for range 5 {
		clock.AdvanceToNext(t)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("purged a module used 5 minutes ago: %v", err)
	}
	// Unused for longer than the expiry: purged at the next tick.
	for range 7 {
		clock.AdvanceToNext(t)
	}
	waitGone(t, c, path)
	if _, err := c.Get(ctxOf(t), srv.URL("/m.wasm"), GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := srv.Requests("/m.wasm"); n != 2 {
		t.Errorf("the server was asked %d times, want 2: the purged module is fetched again", n)
	}
	wantModule(t, cfg, path, wasmserver.Module)
}

// waitGone waits until the cache has purged path: the index is empty and
// the file gone.
func waitGone(t *testing.T, c *Cache, path string) {
	t.Helper()
	testkit.WaitFor(t, "the expired module purged", func() bool {
		n, err := c.Modules(ctxOf(t))
		_, serr := os.Stat(path)
		return err == nil && n == 0 && errors.Is(serr, os.ErrNotExist)
	})
}

// The pull policy: a tagged OCI image is fetched again for a new resource
// version only with Always (or the tag latest); IfNotPresent keeps it.
func TestPullPolicy(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	reg := wasmserver.NewRegistry(t, wasmserver.RegistryOptions{})
	reg.Push(t, "plugins/p", "v1", wasmserver.Artifact, wasmserver.Module, wasmserver.RegistryOptions{})
	url := "oci://" + reg.Host() + "/plugins/p:v1"
	c, _ := startCache(t, nil)
	get := func(version string, p PullPolicy) {
		t.Helper()
		if _, err := c.Get(ctxOf(t), url, GetOptions{ResourceName: "ns.plugin", ResourceVersion: version, PullPolicy: p}); err != nil {
			t.Fatal(err)
		}
	}
	get("1", PullIfNotPresent)
	n := reg.Manifests.Load()
	get("2", PullIfNotPresent)
	if reg.Manifests.Load() != n {
		t.Error("IfNotPresent asked the registry again for a held module")
	}
	get("3", PullAlways)
	if reg.Manifests.Load() == n {
		t.Error("Always with a new resource version did not ask the registry")
	}
	n = reg.Manifests.Load()
	get("3", PullAlways)
	if reg.Manifests.Load() != n {
		t.Error("Always with the same resource version asked the registry again")
	}
}

// Bad settings are named.
func TestConfigValidate(t *testing.T) {
	good := testConfig(t, "/var/lib/istio/data")
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("off (no Dir), nothing is required: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Dir = "relative" }, "Dir"},
		{func(c *Config) { c.ModuleExpiry = -time.Second }, "WASM_MODULE_EXPIRY"},
		{func(c *Config) { c.ModuleExpiry = 0 }, "WASM_MODULE_EXPIRY"},
		{func(c *Config) { c.PurgeInterval = 0 }, "WASM_PURGE_INTERVAL"},
		{func(c *Config) { c.HTTPRequestTimeout = 0 }, "WASM_HTTP_REQUEST_TIMEOUT"},
		{func(c *Config) { c.HTTPRequestMaxRetries = 0 }, "WASM_HTTP_REQUEST_MAX_RETRIES"},
		{func(c *Config) { c.MaxModuleBytes = 0 }, "ISTIO_WASM_MAX_BINARY_SIZE_BYTES"},
		{func(c *Config) { c.InsecureRegistries = []string{"a b"} }, "WASM_INSECURE_REGISTRIES"},
	} {
		cfg := good
		tc.edit(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrBadConfig naming %s", cfg, err, tc.want)
		}
	}
}

// A partial download a killed agent left in the directory is removed when
// the cache starts.
func TestPartialDownloadRemovedAtStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	left := filepath.Join(dir, ".fetch-12345")
	testkit.WriteFile(t, left, []byte("\x00asm half"))
	c, _ := startCache(t, nil, func(c *Config) { c.Dir = dir })
	if _, err := c.Modules(ctxOf(t)); err != nil { // Run is past its start
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the partial download is still there: %v", err)
	}
}

// A compat layer that is small compressed but large decompressed (zeros
// before plugin.wasm) fails the fetch naming the bound, rather than
// decompressing until the fetch's timeout (#33's class, in #35's reader).
func TestCompatLayerDecompressionBound(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	module := wasmserver.ModuleWith("small")
	layer := wasmserver.TarGzFiles(t,
		wasmserver.File{Name: "padding", Content: make([]byte, 1<<20)},
		wasmserver.File{Name: "plugin.wasm", Content: module})
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(layer, types.DockerLayer))
	if err != nil {
		t.Fatal(err)
	}
	reg := wasmserver.NewRegistry(t, wasmserver.RegistryOptions{})
	reg.PushImage(t, "plugins/padded", "compat", img, wasmserver.RegistryOptions{})

	const max = 64 << 10
	if int64(len(layer)) > max {
		t.Fatalf("the padded layer is %d bytes compressed: the test needs it under the bound", len(layer))
	}
	c, _ := startCache(t, nil, func(c *Config) { c.MaxModuleBytes = max })
	_, err = c.Get(ctxOf(t), "oci://"+reg.Host()+"/plugins/padded:compat", GetOptions{})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "decompressed") {
		t.Fatalf("got %v, want ErrTooLarge naming the decompressed content", err)
	}
	// The same layer passes under a bound it fits: the bound, not the
	// layout, refused it.
	c2, cfg2 := startCache(t, nil, func(c *Config) { c.MaxModuleBytes = 1 << 20 })
	path, err := c2.Get(ctxOf(t), "oci://"+reg.Host()+"/plugins/padded:compat", GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantModule(t, cfg2, path, module)
}
