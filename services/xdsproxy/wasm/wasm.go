// Package wasm fetches the Wasm modules of Envoy's extension configs (ECDS)
// for the XDS proxy, as Istio's agent does (pkg/wasm, issue #35): a
// TypedExtensionConfig whose Wasm filter loads its code from a remote
// place (oci:// or http(s)://) is rewritten to load a local file, which
// the agent fetched, checked and cached on disk first; Envoy cannot load
// an OCI image itself.
//
// The parts, top-down:
//   - Config: Istio's variables (WASM_*), the cache directory and the size
//     bound;
//   - Cache (cache.go): the modules on disk, indexed by one goroutine (Run)
//     that also purges the expired ones on the injectable clock; a fetch
//     runs on its caller's goroutine, never on the index's;
//   - the fetchers (http.go, oci.go): HTTP(S) with a timeout and retries,
//     OCI registries with the pod's pull secret in Istio's two image
//     layouts;
//   - Rewrite (rewrite.go): one TypedExtensionConfig, remote to local, or,
//     when the fetch fails, Istio's stand-in filter by the plugin's failure
//     policy;
//   - metrics.go: Istio's Wasm metrics, by Istio's names.
package wasm

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// The fetch's own tuning, which no variable sets (Istio's). What a variable
// sets (WASM_*, ISTIO_WASM_MAX_BINARY_SIZE_BYTES) has its default in cmd's
// env table alone (#34): here it is a required field of Config.
const (
	// DefaultRetryBackoff is the first wait between HTTP attempts (Istio's
	// 500ms, doubling).
	DefaultRetryBackoff = 500 * time.Millisecond
	// DefaultFetchTimeout bounds a whole fetch when the resource's
	// http_uri has no timeout (Istio's 5s; istiod always sets 30s).
	DefaultFetchTimeout = 5 * time.Second
)

// Config is the module cache's configuration. With Dir set, every
// variable's value is required: Validate refuses a zero. A field tagged
// env:"NAME" takes that variable's value (testkit.FillFromTable).
type Config struct {
	// Dir holds the modules: <Dir>/<sha256 of the module's name>/<sha256
	// of the module>.wasm (Istio: /var/lib/istio/data). Empty: ECDS is
	// forwarded unchanged (ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION
	// false).
	Dir string
	// InsecureRegistries are hosts (host or host:port) fetched without
	// verifying their certificate, or over plain HTTP; "*" is every host
	// (WASM_INSECURE_REGISTRIES, comma separated).
	InsecureRegistries []string
	// ModuleExpiry: a module not used for this long is removed at the next
	// purge (WASM_MODULE_EXPIRY); PurgeInterval: how often the cache
	// looks (WASM_PURGE_INTERVAL).
	ModuleExpiry  time.Duration `env:"WASM_MODULE_EXPIRY"`
	PurgeInterval time.Duration `env:"WASM_PURGE_INTERVAL"`
	// HTTPRequestTimeout bounds each HTTP(S) request
	// (WASM_HTTP_REQUEST_TIMEOUT); HTTPRequestMaxRetries is how many
	// attempts an HTTP(S) fetch makes (WASM_HTTP_REQUEST_MAX_RETRIES).
	HTTPRequestTimeout    time.Duration `env:"WASM_HTTP_REQUEST_TIMEOUT"`
	HTTPRequestMaxRetries int           `env:"WASM_HTTP_REQUEST_MAX_RETRIES"`
	// MaxModuleBytes bounds a module, and what is read to find it (a
	// layer, an archive); a larger one fails the fetch
	// (ISTIO_WASM_MAX_BINARY_SIZE_BYTES).
	MaxModuleBytes int64 `env:"ISTIO_WASM_MAX_BINARY_SIZE_BYTES"`
	// RetryBackoff is the first wait between HTTP attempts (0:
	// DefaultRetryBackoff, taken where it is used).
	RetryBackoff time.Duration
}

// ErrBadConfig is wrapped by every Validate error.
var ErrBadConfig = errors.New("bad wasm configuration")

// Enabled: ECDS resources with remote Wasm code are rewritten.
func (c Config) Enabled() bool { return c.Dir != "" }

// Validate names the setting that is wrong.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	if c.Dir != "" && !filepath.IsAbs(c.Dir) {
		return bad("Dir %q must be an absolute path", c.Dir)
	}
	if c.RetryBackoff < 0 {
		return bad("RetryBackoff %v must not be negative", c.RetryBackoff)
	}
	for _, h := range c.InsecureRegistries {
		if h == "" || strings.ContainsAny(h, " /") {
			return bad("InsecureRegistries (WASM_INSECURE_REGISTRIES) has %q: want a host or host:port", h)
		}
	}
	if !c.Enabled() {
		return nil
	}
	// Required with Dir: a zero would purge without pause, never wait for
	// an answer, fetch nothing or fit no module.
	for name, d := range map[string]time.Duration{
		"ModuleExpiry (WASM_MODULE_EXPIRY)":              c.ModuleExpiry,
		"PurgeInterval (WASM_PURGE_INTERVAL)":            c.PurgeInterval,
		"HTTPRequestTimeout (WASM_HTTP_REQUEST_TIMEOUT)": c.HTTPRequestTimeout,
	} {
		if d <= 0 {
			return bad("%s %v must be positive", name, d)
		}
	}
	if c.HTTPRequestMaxRetries < 1 {
		return bad("HTTPRequestMaxRetries (WASM_HTTP_REQUEST_MAX_RETRIES) %d must be at least 1", c.HTTPRequestMaxRetries)
	}
	if c.MaxModuleBytes <= 0 {
		return bad("MaxModuleBytes (ISTIO_WASM_MAX_BINARY_SIZE_BYTES) %d must be positive", c.MaxModuleBytes)
	}
	return nil
}

// insecure: host may be fetched without verifying its certificate.
func (c Config) insecure(host string) bool {
	for _, h := range c.InsecureRegistries {
		if h == "*" || h == host {
			return true
		}
	}
	return false
}
