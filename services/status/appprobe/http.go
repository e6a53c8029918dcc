package appprobe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxProbeBody is how much of the application's answer is copied back to
// kubelet (Istio's maxRespBodyLength, kubelet's own limit).
const maxProbeBody = 10 << 10

// maxProbeRedirects is kubelet's limit on redirects followed on the same
// host.
const maxProbeRedirects = 10

// httpProbe is one HTTP GET to the application.
type httpProbe struct {
	url    string
	host   string // the Host header; "" for the URL's
	header http.Header
}

// newProbeHTTPClient is kubelet's probe client as Istio builds it
// (NewServer, setTransportDefaults): TLS without verification, HTTP/2 over
// TLS unless ISTIO_ENABLE_HTTP2_PROBING=false, a new connection per probe
// unless ENABLE_PROBE_KEEPALIVE_CONNECTIONS=true, and kubelet's redirect
// rule. One client serves every probe: the timeout comes with each
// request's context.
func newProbeHTTPClient(cfg Config, d *probeDialer) *http.Client {
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(!cfg.DisableHTTP2)
	transport := &http.Transport{
		DialContext: d.DialContext,
		// kubelet skips verification too: the application's certificate
		// is rarely issued for its pod IP.
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as kubelet
		TLSHandshakeTimeout: 10 * time.Second,
		// A probe that keeps its connection can be failed by an idle
		// timeout of the application's; kubelet does not keep them.
		DisableKeepAlives: !cfg.KeepAlive,
		IdleConnTimeout:   90 * time.Second,
		Protocols:         protocols,
		// Istio's HTTP/2 pings (setTransportDefaults).
		HTTP2: &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 15 * time.Second},
	}
	return &http.Client{Transport: transport, CheckRedirect: checkProbeRedirect}
}

// checkProbeRedirect is kubelet's rule (pkg/probe/http, which Istio copies):
// a redirect to another host ends the probe with the redirect itself, which
// counts as success; on the same host up to 10 are followed.
func checkProbeRedirect(req *http.Request, via []*http.Request) error {
	if req.URL.Hostname() != via[0].URL.Hostname() {
		return http.ErrUseLastResponse
	}
	if len(via) >= maxProbeRedirects {
		return fmt.Errorf("stopped after %d redirects", maxProbeRedirects)
	}
	return nil
}

// http probes the application and reads the start of its answer.
func (p *Prober) http(ctx context.Context, probe httpProbe) probeResult {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, probe.url, nil)
	if err != nil {
		return failed(fmt.Errorf("probe request %s: %w", probe.url, err))
	}
	if probe.header != nil {
		req.Header = probe.header
	}
	if probe.host != "" {
		req.Host = probe.host
	}
	resp, err := p.client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return failed(fmt.Errorf("GET %s: no answer within the probe's timeout: %w", probe.url, err))
		}
		return failed(fmt.Errorf("GET %s: %w", probe.url, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		// What is left of a redirect (to another host, or one without a
		// Location) is success; a bare 3xx would confuse kubelet's own
		// redirect handling, so Istio answers 200.
		return probeResult{code: http.StatusOK}
	}
	// A body cut short (the timeout came while reading) does not change
	// the verdict: the status is what kubelet judges.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProbeBody))
	return probeResult{code: resp.StatusCode, body: body}
}

// appHTTPRequest turns kubelet's request into the application's: the same
// headers, the Host kubelet sent (with the application's port if kubelet
// named the status port), to the probe's port and path on the probe host.
func (p *Prober) appHTTPRequest(r *http.Request, get *HTTPGetAction) httpProbe {
	scheme, path := get.urlScheme(), get.urlPath()
	port := strconv.Itoa(int(get.Port))
	host := r.Host
	if h, sp, err := net.SplitHostPort(r.Host); err == nil && sp != "" && sp == localPort(r) {
		host = net.JoinHostPort(h, port)
	}
	return httpProbe{
		url:    scheme + "://" + net.JoinHostPort(p.host(), port) + path,
		host:   host,
		header: endToEnd(r.Header),
	}
}

// endToEnd is a copy of the header without its hop-by-hop fields (RFC 9110
// 7.6.1), which belong to kubelet's connection, not the application's.
// Istio copies them all, so kubelet's "Connection: close" closes every
// probe connection even with ENABLE_PROBE_KEEPALIVE_CONNECTIONS=true.
func endToEnd(h http.Header) http.Header {
	out := h.Clone()
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			out.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"} {
		out.Del(name)
	}
	return out
}

// localPort is the port r came in on: the status server's, which kubelet
// names in Host when the probe named none of its own; "" if unknown.
func localPort(r *http.Request) string {
	addr, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if addr == nil {
		return ""
	}
	_, port, _ := net.SplitHostPort(addr.String())
	return port
}
