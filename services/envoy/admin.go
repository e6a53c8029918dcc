package envoy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// adminClient talks to Envoy's admin API.
type adminClient struct {
	base string // "http://127.0.0.1:15000"
	http *http.Client
}

func newAdminClient(addr string) *adminClient {
	return &adminClient{
		base: "http://" + addr,
		// Envoy's admin is on loopback: no proxy from the environment. One
		// kept-alive connection serves the readiness polls; Serve closes
		// it when it returns (closeIdle).
		http: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, IdleConnTimeout: 10 * time.Second}},
	}
}

// closeIdle closes the kept-alive connection, and with it the transport's
// goroutines.
func (a *adminClient) closeIdle() { a.http.CloseIdleConnections() }

// ready reports whether GET /ready answers 200 "LIVE".
func (a *adminClient) ready(ctx context.Context) (bool, error) {
	body, code, err := a.do(ctx, http.MethodGet, "/ready", time.Second)
	if err != nil {
		return false, err
	}
	return code == http.StatusOK && strings.TrimSpace(body) == "LIVE", nil
}

// drainListeners asks Envoy to drain its listeners with query (Istio's
// "inboundonly&graceful" for a sidecar, "graceful" for a gateway); skipExit
// adds "&skip_exit", as Istio does for POST /drain, which drains but keeps
// Envoy running (pkg/envoy/admin.go DrainListeners).
func (a *adminClient) drainListeners(ctx context.Context, query string, skipExit bool) error {
	if skipExit {
		query += "&skip_exit"
	}
	body, code, err := a.do(ctx, http.MethodPost, "/drain_listeners?"+query, 2*time.Second)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("POST %s/drain_listeners: %d %s", a.base, code, strings.TrimSpace(body))
	}
	return nil
}

// activeConnections sums Envoy's listener.<name>.downstream_cx_active stats
// the way Istio does: only "listener." stats, not the per-worker ones, not
// Envoy's internal listeners, and not the listeners named in excluded (the
// agent's own). It returns -1 when Envoy reports no such stat at all.
func (a *adminClient) activeConnections(ctx context.Context, excluded []string, timeout time.Duration) (int, error) {
	body, code, err := a.do(ctx, http.MethodGet, "/stats?usedonly&filter=downstream_cx_active$", timeout)
	if err != nil {
		return -1, err
	}
	if code != http.StatusOK {
		return -1, fmt.Errorf("GET %s/stats: %d", a.base, code)
	}
	return sumActiveConnections(body, excluded), nil
}

// sumActiveConnections parses /stats text ("name: value" lines).
func sumActiveConnections(stats string, excluded []string) int {
	if strings.TrimSpace(stats) == "" {
		return -1
	}
	skip := make(map[string]bool, len(excluded))
	for _, l := range excluded {
		skip["listener."+l+".downstream_cx_active"] = true
	}
	total := 0
	sc := bufio.NewScanner(strings.NewReader(stats))
	for sc.Scan() {
		name, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), ": ")
		if !ok || !strings.HasPrefix(name, "listener.") || strings.Contains(name, "worker_") ||
			strings.HasPrefix(name, "listener.envoy_internal_") || skip[name] {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(value), 10, 63)
		if err != nil {
			continue
		}
		total += int(n)
	}
	return total
}

func (a *adminClient) do(ctx context.Context, method, path string, timeout time.Duration) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return string(body), resp.StatusCode, err
}

// pollReady polls admin /ready until ctx is done and sends each change of
// readiness (starting from not ready) on out, which holds one value; a
// value not yet read is replaced by the newer one.
func (s *Service) pollReady(ctx context.Context, out chan bool) {
	last := false
	for {
		ready, _ := s.admin.ready(ctx) // not answering is not ready
		if ready != last {
			last = ready
			select { // replace an unread value
			case <-out:
			default:
			}
			out <- ready
		}
		// Once ready, a change is rare: poll at most once a second.
		interval := s.cfg.ReadyPollInterval
		if last {
			interval = max(interval, time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(interval):
		}
	}
}
