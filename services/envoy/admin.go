package envoy

import (
	"bufio"
	"context"
	"encoding/json"
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
		http: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, IdleConnTimeout: 10 * time.Second,
			MaxResponseHeaderBytes: 1 << 20}},
	}
}

// closeIdle closes the kept-alive connection, and with it the transport's
// goroutines.
func (a *adminClient) closeIdle() { a.http.CloseIdleConnections() }

// readinessStats are the stats Istio's readiness probe reads
// (pilot-agent status/util/stats.go), in one request.
const readinessStats = `/stats?usedonly&filter=^(server\.state|listener_manager\.workers_started|(cluster_manager\.cds|listener_manager\.lds)\.update_(success|rejected))$`

// readiness is Envoy's readiness by Istio's rules: first its config must
// have arrived (cds and lds update_success above 0), then the server must be
// LIVE with its workers started. Not ready comes with Istio's reason, which
// tells a config that never came from one that was rejected. restartEpoch
// is the hot restart epoch whose readiness is asked, -1 without hot
// restart: the admin port is the old epoch's until the new one takes it,
// and /server_info says whose answer it is (#25).
func (a *adminClient) readiness(ctx context.Context, restartEpoch int) (ready bool, why string) {
	if restartEpoch >= 0 {
		got, err := a.restartEpoch(ctx)
		switch {
		case err != nil:
			return false, "admin API not answering: " + err.Error()
		case got != restartEpoch:
			return false, fmt.Sprintf("admin API answered by hot restart epoch %d, not yet by %d", got, restartEpoch)
		}
	}
	body, code, err := a.do(ctx, http.MethodGet, readinessStats, 3*time.Second)
	switch {
	case err != nil:
		return false, "admin API not answering: " + err.Error()
	case code != http.StatusOK:
		return false, fmt.Sprintf("admin API /stats answered %d", code)
	}
	stats := map[string]uint64{}
	for _, line := range strings.Split(body, "\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64); err == nil {
			stats[strings.TrimSpace(name)] = n
		}
	}
	cdsOK, ldsOK := stats["cluster_manager.cds.update_success"], stats["listener_manager.lds.update_success"]
	cdsNo, ldsNo := stats["cluster_manager.cds.update_rejected"], stats["listener_manager.lds.update_rejected"]
	counts := fmt.Sprintf("cds updates: %d successful, %d rejected; lds updates: %d successful, %d rejected", cdsOK, cdsNo, ldsOK, ldsNo)
	switch {
	case cdsOK == 0 && ldsOK == 0:
		if cdsNo > 0 || ldsNo > 0 {
			return false, "config received from XDS server, but was rejected: " + counts
		}
		return false, "config not received from XDS server (is the control plane reachable?): " + counts
	case cdsOK == 0 || ldsOK == 0:
		if cdsNo > 0 || ldsNo > 0 {
			return false, "config received from XDS server, but was rejected: " + counts
		}
		return false, "config not fully received from XDS server: " + counts
	}
	state, ok := stats["server.state"]
	switch {
	case !ok:
		return false, "server.state is not yet updated"
	case state != 0:
		return false, "server is not live, current state is: " + serverStateName(state)
	case stats["listener_manager.workers_started"] != 1:
		return false, "workers have not yet started"
	}
	return true, ""
}

// restartEpoch is the --restart-epoch of the Envoy that answers on the
// admin port (/server_info's command_line_options.restart_epoch).
func (a *adminClient) restartEpoch(ctx context.Context) (int, error) {
	body, code, err := a.do(ctx, http.MethodGet, "/server_info", 3*time.Second)
	if err != nil {
		return -1, err
	}
	if code != http.StatusOK {
		return -1, fmt.Errorf("GET %s/server_info: %d", a.base, code)
	}
	var info struct {
		CommandLineOptions struct {
			RestartEpoch *int `json:"restart_epoch"`
		} `json:"command_line_options"`
	}
	if err := json.Unmarshal([]byte(body), &info); err != nil {
		return -1, fmt.Errorf("GET %s/server_info: %w", a.base, err)
	}
	if info.CommandLineOptions.RestartEpoch == nil {
		return 0, nil // Envoy omits a zero in its proto JSON
	}
	return *info.CommandLineOptions.RestartEpoch, nil
}

// serverStateName is Envoy's name for a server.state value.
func serverStateName(s uint64) string {
	switch s {
	case 0:
		return "LIVE"
	case 1:
		return "DRAINING"
	case 2:
		return "PRE_INITIALIZING"
	case 3:
		return "INITIALIZING"
	}
	return "UNKNOWN"
}

// drainListeners asks Envoy to drain its listeners with query (Istio's
// "inboundonly&graceful" for a sidecar, "graceful" for a gateway); skipExit
// adds "&skip_exit", as Istio does for POST /drain, which drains but keeps
// Envoy running (pkg/envoy/admin.go DrainListeners).
func (a *adminClient) drainListeners(ctx context.Context, query string, skipExit bool) error {
	if skipExit {
		query += "&skip_exit"
	}
	return a.post(ctx, "/drain_listeners?"+query)
}

// post POSTs to path, which must answer 200.
func (a *adminClient) post(ctx context.Context, path string) error {
	body, code, err := a.do(ctx, http.MethodPost, path, 2*time.Second)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("POST %s%s: %d %s", a.base, path, code, strings.TrimSpace(body))
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
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAdminAnswer+1))
	if err == nil && len(body) > maxAdminAnswer {
		// Said, not cut silently (#33): a cut /stats would read as fewer
		// connections than Envoy has.
		return "", resp.StatusCode, fmt.Errorf("envoy admin %s %s: answer cut at %d MiB (the bound)", method, path, maxAdminAnswer>>20)
	}
	return string(body), resp.StatusCode, err
}

// maxAdminAnswer bounds an answer of Envoy's admin API as the agent reads
// it: the readiness stats and the active connections are a few lines.
const maxAdminAnswer = 4 << 20

// readiness is one verdict of the readiness poll.
type readiness struct {
	epoch int // the Envoy process asked about (child.epoch)
	ready bool
	why   string // Istio's reason when not ready
}

// poller is the readiness poll of one Envoy process.
type poller struct {
	out    chan readiness
	cancel context.CancelFunc
	done   chan struct{}
}

// startPoller polls c's readiness until it is ready, ctx is done, or stop.
func (s *Service) startPoller(ctx context.Context, c *child) *poller {
	ctx, cancel := context.WithCancel(ctx)
	p := &poller{out: make(chan readiness, 1), cancel: cancel, done: make(chan struct{})}
	restartEpoch := -1
	if s.cfg.HotRestart != nil {
		restartEpoch = c.restartEpoch
	}
	// The poll reads nothing of s that Serve's goroutine may change (a
	// hot restart replaces s.cfg).
	interval := s.cfg.ReadyPollInterval
	go func() {
		defer close(p.done)
		s.pollReady(ctx, p.out, c.epoch, restartEpoch, interval)
	}()
	return p
}

// stop ends the poll and waits for it.
func (p *poller) stop() {
	p.cancel()
	<-p.done
}

// pollReady polls Envoy's readiness until it is ready or ctx is done, and
// sends each change of the verdict on out, which holds one value (a value
// not yet read is replaced by the newer one). Once ready it stops, as
// Istio's probe does: a LIVE Envoy with started workers does not go back in
// its lifetime (only a drain, which the service itself starts, changes it).
func (s *Service) pollReady(ctx context.Context, out chan readiness, epoch, restartEpoch int, interval time.Duration) {
	var last readiness
	began := s.clock.Now()
	for {
		ready, why := s.admin.readiness(ctx, restartEpoch)
		if now := (readiness{epoch, ready, why}); now != last {
			last = now
			sendLatest(out, now)
		}
		if ready {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(interval):
		}
		if s.clock.Now().Sub(began) >= slowReadyPollAfter {
			interval = max(interval, slowReadyPollInterval)
		}
	}
}
