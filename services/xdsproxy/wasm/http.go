package wasm

import (
	"archive/tar"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/meshagent/meshagent/messages"
)

// ErrTooLarge: a module, or what holds it, is larger than MaxModuleBytes.
// Istio's agent reads up to its bound and cuts the rest off silently (a
// truncated module then fails its checksum, or reaches Envoy); ours fails
// the fetch, saying so.
var ErrTooLarge = errors.New("larger than the Wasm module bound (ISTIO_WASM_MAX_BINARY_SIZE_BYTES)")

// httpFetcher fetches a module with GET, as Istio's HTTPFetcher: each
// request bounded by HTTPRequestTimeout, HTTPRequestMaxRetries attempts in
// all, retrying transport errors and 5xx answers (but 501, 505, 511) after
// a backoff that doubles from RetryBackoff. The answer may be the module, or
// a gzip or tar holding it (the first file).
type httpFetcher struct {
	client, insecureClient *http.Client
	cfg                    Config
	clock                  messages.Clock
}

func newHTTPFetcher(cfg Config, clock messages.Clock) *httpFetcher {
	t := http.DefaultTransport.(*http.Transport).Clone()
	// Only for the hosts the operator named (WASM_INSECURE_REGISTRIES).
	t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec
	return &httpFetcher{
		client:         &http.Client{Timeout: cfg.HTTPRequestTimeout},
		insecureClient: &http.Client{Timeout: cfg.HTTPRequestTimeout, Transport: t},
		cfg:            cfg, clock: clock,
	}
}

func (f *httpFetcher) fetch(ctx context.Context, url string, insecure bool) ([]byte, error) {
	c := f.client
	if insecure {
		c = f.insecureClient
	}
	wait := cmp.Or(f.cfg.RetryBackoff, DefaultRetryBackoff)
	var last error
	attempts := 0
	for attempts < f.cfg.HTTPRequestMaxRetries {
		attempts++
		b, retry, err := f.get(ctx, c, url)
		if err == nil {
			return unbox(b, f.cfg.MaxModuleBytes)
		}
		last = err
		if !retry || ctx.Err() != nil {
			break
		}
		select {
		case <-f.clock.After(wait):
		case <-ctx.Done():
		}
		wait *= 2
	}
	return nil, fmt.Errorf("wasm module download failed after %d attempts, last error: %w", attempts, last)
}

// get makes one attempt; retry: a later one may succeed.
func (f *httpFetcher) get(ctx context.Context, c *http.Client, url string) (b []byte, retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, false, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, true, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, retryable(resp.StatusCode), fmt.Errorf("wasm module download request failed: status code %d", resp.StatusCode)
	}
	b, err = readBounded(resp.Body, f.cfg.MaxModuleBytes)
	return b, false, err
}

func retryable(code int) bool {
	return code >= 500 && code != http.StatusNotImplemented &&
		code != http.StatusHTTPVersionNotSupported && code != http.StatusNetworkAuthenticationRequired
}

// readBounded reads r to its end, failing past max bytes.
func readBounded(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(newBoundedReader(r, max, "the module"))
	if err != nil {
		return nil, err
	}
	return b, nil
}

// boundedReader reads r, failing with ErrTooLarge (naming what and the
// bound) once more than max bytes come, where io.LimitReader would end the
// stream as if it were whole.
type boundedReader struct {
	r        io.Reader
	max, got int64
	what     string
}

func newBoundedReader(r io.Reader, max int64, what string) *boundedReader {
	return &boundedReader{r: r, max: max, what: what}
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if room := b.max + 1 - b.got; int64(len(p)) > room {
		p = p[:room]
	}
	n, err := b.r.Read(p)
	b.got += int64(n)
	if b.got > b.max {
		return n, fmt.Errorf("%w: %s is more than %d bytes", ErrTooLarge, b.what, b.max)
	}
	return n, err
}

var (
	wasmMagic = []byte("\x00asm")
	gzipMagic = []byte{0x1f, 0x8b}
	tarMagic  = []byte("ustar")
)

// validModule is Istio's check of a module: the 8-byte header, starting
// with the magic number.
func validModule(b []byte) bool { return len(b) >= 8 && bytes.Equal(b[:4], wasmMagic) }

// unbox takes the module out of a gzip or a tar, as often as they are
// nested; what is neither is returned as it is (its check comes later).
func unbox(b []byte, max int64) ([]byte, error) {
	for range 8 {
		switch {
		case validModule(b):
			return b, nil
		case len(b) > 2 && bytes.Equal(b[:2], gzipMagic):
			zr, err := gzip.NewReader(bytes.NewReader(b))
			if err != nil {
				return b, nil
			}
			if b, err = readBounded(zr, max); err != nil {
				return nil, err
			}
		case len(b) > 262 && bytes.Equal(b[257:262], tarMagic):
			tr := tar.NewReader(bytes.NewReader(b))
			h, err := tr.Next()
			if err != nil {
				return b, nil
			}
			if h.Size > max {
				return nil, fmt.Errorf("%w: %s is %d bytes", ErrTooLarge, h.Name, h.Size)
			}
			if b, err = readBounded(tr, max); err != nil {
				return nil, err
			}
		default:
			return b, nil
		}
	}
	return b, nil
}

// fetchTimeout is the bound of a whole fetch: the resource's http_uri
// timeout, else Istio's 5s.
func fetchTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultFetchTimeout
	}
	return d
}
