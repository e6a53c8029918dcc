package wasm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/meshagent/meshagent/messages"
)

// ErrStopped: the cache's Run is not running (the proxy stops).
var ErrStopped = errors.New("the Wasm module cache is stopped")

// PullPolicy is the WasmPlugin's imagePullPolicy, as istiod passes it in
// the VM's environment (ISTIO_META_WASM_IMAGE_PULL_POLICY).
type PullPolicy int

const (
	PullUnspecified PullPolicy = iota
	PullIfNotPresent
	PullAlways
)

// GetOptions describe one module wanted.
type GetOptions struct {
	// Checksum is the module's sha256, hex (the resource's remote.sha256);
	// empty: not checked, the digest found names the module.
	Checksum string
	// ResourceName and ResourceVersion are the WasmPlugin's: with
	// PullAlways, a new resource version fetches again.
	ResourceName    string
	ResourceVersion string
	// Timeout bounds the whole fetch (the http_uri's timeout).
	Timeout    time.Duration
	PullSecret []byte // a .dockerconfigjson; nil: the default keychain
	PullPolicy PullPolicy
}

// Cache holds the fetched modules on disk. Its index (which module is
// where, when it was last used, which URL last resolved to which
// checksum) is owned by the goroutine of Run: Get asks it, and fetches on
// its own goroutine in between, so that one slow registry holds up only
// its own resources. The index outlives Run, as the proxy's state outlives
// Serve.
type Cache struct {
	cfg   Config
	clock messages.Clock
	log   *slog.Logger
	http  *httpFetcher
	reqs  chan func(*index)
	idx   *index // Run's alone
	m     *metrics
}

// NewCache returns the cache of cfg; Run must run
// for Get to answer.
func NewCache(cfg Config, clock messages.Clock, log *slog.Logger) *Cache {
	if clock == nil {
		clock = messages.SystemClock{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cache{cfg: cfg, clock: clock, log: log, http: newHTTPFetcher(cfg, clock),
		reqs: make(chan func(*index)), idx: newIndex(cfg.Dir), m: newMetrics()}
}

// Run serves the index and purges modules unused for ModuleExpiry every
// PurgeInterval, until ctx ends. It first removes the partial downloads a
// killed agent may have left (store's temporary files).
func (c *Cache) Run(ctx context.Context) {
	if left, _ := filepath.Glob(filepath.Join(c.cfg.Dir, tempPattern)); len(left) > 0 {
		for _, f := range left {
			os.Remove(f)
		}
		c.log.Info("removed partial Wasm downloads", "files", len(left))
	}
	tick := c.clock.After(c.cfg.PurgeInterval)
	for {
		select {
		case f := <-c.reqs:
			f(c.idx)
		case <-tick:
			c.idx.purge(c.clock.Now(), c.cfg.ModuleExpiry, c.log)
			c.m.entries.Set(float64(len(c.idx.modules)))
			tick = c.clock.After(c.cfg.PurgeInterval)
		case <-ctx.Done():
			return
		}
	}
}

// ask runs f on the index, on Run's goroutine.
func (c *Cache) ask(ctx context.Context, f func(*index)) error {
	ran := make(chan struct{})
	select {
	case c.reqs <- func(x *index) { f(x); close(ran) }:
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrStopped, ctx.Err())
	}
	<-ran
	return nil
}

// Modules is how many modules the index holds.
func (c *Cache) Modules(ctx context.Context) (int, error) {
	var n int
	err := c.ask(ctx, func(x *index) { n = len(x.modules) })
	return n, err
}

// Get returns the path of the module at downloadURL (oci://, http://,
// https://), fetching it unless the cache holds it, as Istio's
// LocalFileCache.Get.
func (c *Cache) Get(ctx context.Context, downloadURL string, o GetOptions) (string, error) {
	u, err := url.Parse(downloadURL)
	if err != nil {
		return "", fmt.Errorf("fail to parse Wasm module fetch url: %s, error: %w", downloadURL, err)
	}
	key := cacheKey{moduleKey: moduleKey{name: moduleName(downloadURL), checksum: o.Checksum},
		url: downloadURL, resource: o.ResourceName, version: o.ResourceVersion}
	ignoreVersion := ignoresResourceVersion(o.PullPolicy, u)
	hit, err := c.lookup(ctx, &key, ignoreVersion)
	if err != nil || hit != "" {
		return hit, err
	}

	ctx, cancel := context.WithTimeout(ctx, fetchTimeout(o.Timeout))
	defer cancel()
	insecure := c.cfg.insecure(u.Host)
	var module []byte
	var digest string
	var img *ociImage
	switch u.Scheme {
	case "http", "https":
		if module, err = c.http.fetch(ctx, downloadURL, insecure); err != nil {
			c.m.fetches.WithLabelValues(downloadFailure).Inc()
			return "", err
		}
		sum := sha256.Sum256(module)
		digest = hex.EncodeToString(sum[:])
	case "oci":
		if img, err = resolveOCI(ctx, u.Host+u.Path, o.PullSecret, insecure, c.cfg.MaxModuleBytes); err != nil {
			c.m.fetches.WithLabelValues(manifestFailure).Inc()
			return "", fmt.Errorf("could not fetch Wasm OCI image: %w", err)
		}
		digest = img.digest
	default:
		return "", fmt.Errorf("unsupported Wasm module downloading URL scheme: %v", u.Scheme)
	}

	if key.checksum == "" {
		// Known by its digest now: another URL may have fetched it.
		key.checksum = digest
		if hit, err := c.lookup(ctx, &key, true); err != nil || hit != "" {
			return hit, err
		}
	} else if digest != key.checksum {
		c.m.fetches.WithLabelValues(checksumMismatch).Inc()
		return "", fmt.Errorf("module downloaded from %v has checksum %v, which does not match: %v", downloadURL, digest, key.checksum)
	}
	if img != nil {
		if module, err = img.module(); err != nil {
			c.m.fetches.WithLabelValues(downloadFailure).Inc()
			return "", fmt.Errorf("could not fetch Wasm binary: %w", err)
		}
	}
	if !validModule(module) {
		c.m.fetches.WithLabelValues(fetchFailure).Inc()
		return "", fmt.Errorf("fetched Wasm binary from %s is invalid", downloadURL)
	}
	c.m.fetches.WithLabelValues(fetchSuccess).Inc()
	return c.store(ctx, key, module)
}

// lookup asks the index for key's module (its path, empty if not held),
// and sets key's checksum to the one it resolves to.
func (c *Cache) lookup(ctx context.Context, key *cacheKey, ignoreVersion bool) (string, error) {
	var hit, checksum string
	if err := c.ask(ctx, func(x *index) { hit, checksum = x.lookup(*key, ignoreVersion, c.clock.Now()) }); err != nil {
		return "", err
	}
	if key.checksum == "" {
		key.checksum = checksum
	}
	c.m.lookups.WithLabelValues(strconv.FormatBool(hit != "")).Inc()
	return hit, nil
}

// store writes the module beside its place, and has the index move it in
// and record it: the index decides, so that a purge never removes a file
// it has not indexed yet.
func (c *Cache) store(ctx context.Context, key cacheKey, module []byte) (string, error) {
	if err := os.MkdirAll(c.cfg.Dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(c.cfg.Dir, tempPattern)
	if err != nil {
		return "", err
	}
	_, err = tmp.Write(module)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644) // Envoy may run as another uid
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	var path string
	aerr := c.ask(ctx, func(x *index) {
		path, err = x.add(key, tmp.Name(), c.clock.Now())
		c.m.entries.Set(float64(len(x.modules)))
	})
	if aerr != nil {
		os.Remove(tmp.Name())
		return "", aerr
	}
	return path, err
}

// tempPattern names a module being written, in Dir.
const tempPattern = ".fetch-*"

// moduleKey names a module by what it is, not where it was found: a URL
// without its tag or digest, and the checksum.
type moduleKey struct{ name, checksum string }

type cacheKey struct {
	moduleKey
	url               string
	resource, version string // the WasmPlugin's name and resource version
}

// moduleName is an OCI reference without its tag or digest; any other URL
// as it is.
func moduleName(u string) string {
	if ref, ok := strings.CutPrefix(u, "oci://"); ok {
		if r, err := name.ParseReference(ref); err == nil {
			return "oci://" + r.Context().Name()
		}
	}
	return u
}

// ignoresResourceVersion: a cached module serves whatever the resource's
// version. Istio's default is IfNotPresent, but for OCI images tagged
// latest.
func ignoresResourceVersion(p PullPolicy, u *url.URL) bool {
	switch p {
	case PullAlways:
		return false
	case PullIfNotPresent:
		return true
	}
	return u.Scheme != "oci" || !strings.HasSuffix(u.Path, ":latest")
}

// index is the cache's state: Run's goroutine alone touches it.
type index struct {
	dir     string
	modules map[moduleKey]*entry
	// checksums: what a tagged OCI URL or an HTTP URL last resolved to.
	checksums map[string]*resolved
}

type entry struct {
	path string
	last time.Time
	urls map[string]bool // the URLs resolved to it (checksums' keys)
}

type resolved struct {
	checksum string
	versions map[string]string // resource name → resource version
}

func newIndex(dir string) *index {
	return &index{dir: dir, modules: map[moduleKey]*entry{}, checksums: map[string]*resolved{}}
}

// lookup returns the path of key's module if held (empty if not), and the
// checksum key resolves to: its own, an OCI URL's digest, or what the URL
// last resolved to while the resource version is the same (or does not
// matter).
func (x *index) lookup(key cacheKey, ignoreVersion bool, now time.Time) (string, string) {
	if key.checksum == "" {
		if ref, ok := strings.CutPrefix(key.url, "oci://"); ok {
			if d, err := name.NewDigest(ref); err == nil {
				key.checksum, _ = strings.CutPrefix(d.DigestStr(), "sha256:")
				if !strings.HasPrefix(d.DigestStr(), "sha256:") {
					key.checksum = ""
				}
			}
		}
	}
	if key.checksum == "" {
		if r := x.checksums[key.url]; r != nil {
			if ignoreVersion || key.version == r.versions[key.resource] {
				key.checksum = r.checksum
			}
			r.versions[key.resource] = key.version
		}
	}
	e := x.modules[key.moduleKey]
	if e == nil {
		return "", key.checksum
	}
	e.last = now
	x.resolve(key)
	return e.path, key.checksum
}

// resolve records what a tagged OCI URL or an HTTP URL resolved to; false
// for a URL that names its digest.
func (x *index) resolve(key cacheKey) bool {
	if strings.HasPrefix(key.url, "oci://") && strings.Contains(key.url, "@") {
		return false
	}
	r := x.checksums[key.url]
	if r == nil {
		r = &resolved{versions: map[string]string{}}
		x.checksums[key.url] = r
	}
	r.checksum = key.checksum
	r.versions[key.resource] = key.version
	return true
}

// add moves the fetched file tmp to the module's place (or drops it when
// the module is held already) and indexes it.
func (x *index) add(key cacheKey, tmp string, now time.Time) (string, error) {
	resolved := x.resolve(key)
	e := x.modules[key.moduleKey]
	if e == nil {
		sum := sha256.Sum256([]byte(key.name))
		dir := filepath.Join(x.dir, hex.EncodeToString(sum[:]))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			os.Remove(tmp)
			return "", err
		}
		path := filepath.Join(dir, key.checksum+".wasm")
		if err := os.Rename(tmp, path); err != nil {
			os.Remove(tmp)
			return "", err
		}
		e = &entry{path: path, urls: map[string]bool{}}
		x.modules[key.moduleKey] = e
	} else {
		os.Remove(tmp)
	}
	e.last = now
	if resolved {
		e.urls[key.url] = true
	}
	return e.path, nil
}

// purge removes the modules unused for longer than expiry, and what their
// URLs resolved to.
func (x *index) purge(now time.Time, expiry time.Duration, log *slog.Logger) {
	for k, e := range x.modules {
		if now.Sub(e.last) <= expiry {
			continue
		}
		if err := os.Remove(e.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("cannot remove an expired Wasm module", "file", e.path, "error", err)
			continue
		}
		for u := range e.urls {
			delete(x.checksums, u)
		}
		delete(x.modules, k)
		log.Info("removed an expired Wasm module", "file", e.path, "unused_for", now.Sub(e.last))
	}
}
