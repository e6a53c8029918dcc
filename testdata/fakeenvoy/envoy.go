package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/proto"
)

// Envoy's server states, as in /server_info and the server.state stat.
const (
	stateLive            = 0
	stateDraining        = 1
	statePreInitializing = 2
)

var stateNames = map[int]string{stateLive: "LIVE", stateDraining: "DRAINING", statePreInitializing: "PRE_INITIALIZING"}

// envoy is the fake's state.
type envoy struct {
	boot      *bootstrapv3.Bootstrap
	k         knobs
	opts      *options
	started   time.Time
	adminAddr string
	adminSrv  *http.Server

	// Hot restart (hotrestart.go): nil with --disable-hot-restart.
	hr *hotRestart
	// firstStarted is when epoch 0 started (uptime_all_epochs).
	firstStarted time.Time
	// live is closed once init has completed (xds.live) and the listeners
	// it brought are open (announceLive).
	live     chan struct{}
	liveOnce sync.Once
	// workers is closed when Envoy's workers start: live, and /ready
	// LIVE (FAKE_ENVOY_NEVER_READY, FAKE_ENVOY_READY_AFTER); the listeners
	// listen from then on (workers.go).
	workers chan struct{}

	mu           sync.Mutex
	healthFailed bool
	// runtime is the admin layer of Envoy's runtime (runtime.go).
	runtime      map[string]string
	drains       []string // raw queries of POST /drain_listeners
	drainStarted time.Time
	// loggers: each logger's level (POST /logging), from the command line
	// until changed; nil until first asked.
	loggers  map[string]string
	active   map[string]int // listener stat name -> open connections
	received map[string]map[string]heldResource
	// received: type URL -> resource name -> resource, for what is not in
	// xds (secrets, other types).
	xds *xdsConfig
	// stats are the counters and gauges written so far, by Envoy name:
	// /stats?usedonly shows exactly these.
	stats map[string]int
	// bound: the listening sockets by listenKey, which a child may ask for;
	// emptied when a child tells this process to drain (hotDraining).
	bound       map[string]net.Listener
	hotDraining bool
	// workersStarting: the workers are starting or started, and a listener
	// added now listens at once (listen, finalInit).
	workersStarting bool
	// removed: the bootstrap's listeners removed because they could not
	// listen (finalInit), gone from /listeners and /config_dump as in Envoy.
	removed map[string]bool

	// staticSecrets: cluster or listener type URL -> the secrets the
	// bootstrap's clusters or listeners name over SDS (sds.go).
	staticSecrets map[string][]secretRef
	// sdsStreams: secret name -> its running subscription (sds.go).
	sdsStreams map[string]secretStream
	// initMoved wakes the ADS stream when init moves on without a
	// response on it (runADS).
	initMoved chan struct{}

	servers []*http.Server
	relays  relays // the capture listeners (relay.go)
	wg      sync.WaitGroup
	ctx     context.Context // the xDS and SDS streams'; ended by shutdown
	cancel  context.CancelFunc
}

func newEnvoy(boot *bootstrapv3.Bootstrap, k knobs) *envoy {
	now := time.Now()
	return &envoy{boot: boot, k: k, opts: &options{}, started: now, firstStarted: now, live: make(chan struct{}), workers: make(chan struct{}),
		active: map[string]int{}, received: map[string]map[string]heldResource{},
		xds: newXDSConfig(), stats: map[string]int{}, bound: map[string]net.Listener{}, removed: map[string]bool{}, runtime: map[string]string{},
		staticSecrets: map[string][]secretRef{}, sdsStreams: map[string]secretStream{}, initMoved: make(chan struct{}, 1)}
}

// start opens the admin API and the static listeners and starts the xDS and
// SDS clients. A listener that cannot be opened is fatal, as in Envoy.
// exit receives a code when the fake must exit (POST /quitquitquit).
func (e *envoy) start(ctx context.Context, exit chan<- int) error {
	ctx, cancel := context.WithCancel(ctx)
	e.mu.Lock()
	e.ctx, e.cancel = ctx, cancel
	e.mu.Unlock()
	sa := e.boot.GetAdmin().GetAddress().GetSocketAddress()
	addr := net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("admin address %s: %w", addr, err)
	}
	e.adminAddr = ln.Addr().String()
	e.adminSrv = e.serve(ln, "admin", e.adminMux(exit))
	e.mu.Lock()
	e.setStatLocked("server.hot_restart_epoch", e.opts.restartEpoch)
	e.mu.Unlock()

	if e.hr != nil {
		go e.hr.serveChild(e)
	}
	if err := e.startListeners(); err != nil {
		return err
	}
	e.reconcileRelays()
	e.startInit()
	e.announceLive()
	go e.startWorkers(ctx)
	e.reconcileSecrets()
	e.startXDS(ctx)
	if e.hr != nil {
		go e.takeOver(ctx)
		go e.flushParentStats(ctx)
	}
	return nil
}

// flushParentStats is the hot restart part of Envoy's stats flush: every
// stats_flush_interval (5s by default) a child asks its parent for stats,
// until it has told it to terminate. A parent gone meanwhile is noticed
// there (hotrestart.go).
func (e *envoy) flushParentStats(ctx context.Context) {
	interval := 5 * time.Second
	if d := e.boot.GetStatsFlushInterval(); d != nil {
		interval = d.AsDuration()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if !e.hr.parentStats() {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// announceLive closes e.live once init has completed. It is called where
// the listeners of the update that completed it are already open, so that a
// child has taken every socket it needs from its parent before it tells the
// parent to drain (Envoy's listeners take theirs when LDS adds them, before
// init completes).
func (e *envoy) announceLive() {
	e.mu.Lock()
	live := e.xds.live
	e.mu.Unlock()
	if live {
		e.liveOnce.Do(func() { close(e.live) })
	}
}

// listen is the socket of the listener called name for addr, which
// listens and accepts once the workers start (workers.go): the parent's
// own when it has one (hot restart: the same socket keeps accepting), else
// a new one, bound now. Added once the workers started, it listens at once
// or is refused, as Envoy's warmed listener (finalInit).
func (e *envoy) listen(name, network, addr string) (net.Listener, error) {
	key := listenKey(addr)
	var sock *os.File
	if e.hr != nil {
		var err error
		if sock, err = e.hr.parentSocket(key); err != nil {
			return nil, err
		}
	}
	if sock == nil {
		var err error
		if sock, err = bindSocket(network, addr); err != nil {
			return nil, err
		}
	}
	ln, err := newWorkerListener(name, key, sock, e.workers)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.bound[key] = ln
	started := e.workersStarting
	e.mu.Unlock()
	if started && !e.finalInit(ln) {
		return nil, fmt.Errorf("listener %s on %s: removed: it cannot listen", name, addr)
	}
	return ln, nil
}

// forget drops a listener closed because the configuration no longer has it.
func (e *envoy) forget(addr string) {
	e.mu.Lock()
	delete(e.bound, listenKey(addr))
	e.mu.Unlock()
}

// takeOver is Envoy's end of start-up with a parent: once initialised
// (what /ready would call LIVE), tell the parent to drain, and after
// --parent-shutdown-time-s to terminate.
func (e *envoy) takeOver(ctx context.Context) {
	select {
	case <-e.workers:
	case <-ctx.Done():
		return
	}
	e.mu.Lock()
	started := e.statLocked("listener_manager.workers_started") == 1
	e.mu.Unlock()
	if !started {
		// A listener failed at the workers' start: Envoy's callback that
		// tells the parent to drain never runs (workers.go).
		return
	}
	e.hr.initialized()
	t := time.NewTimer(time.Duration(e.opts.parentShutdownTimeS) * time.Second)
	defer t.Stop()
	select {
	case <-t.C:
		e.hr.terminateParent("warning: shutting down parent after drain")
	case <-ctx.Done():
	}
}

// terminateParent is Envoy's shutdown with a parent still running: the
// parent is told to terminate first.
func (e *envoy) terminateParent() {
	if e.hr != nil {
		e.hr.terminateParent("shutting down server instance: terminating parent")
	}
}

// shutdownAdmin, listenerFor and drainListeners are the parent's side of
// hot restart (parentSide).
func (e *envoy) shutdownAdmin() time.Time {
	if err := e.adminSrv.Close(); err != nil {
		log.Printf("admin: %v", err)
	}
	log.Printf("admin listener closed: shut down by the child")
	return e.firstStarted
}

func (e *envoy) listenerFor(key string) net.Listener {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.bound[listenKey(strings.TrimPrefix(key, "tcp://"))]
}

func (e *envoy) drainListeners() {
	e.mu.Lock()
	e.hotDraining = true
	if e.drainStarted.IsZero() {
		e.drainStarted = time.Now()
	}
	bound := e.bound
	e.bound = map[string]net.Listener{}
	e.mu.Unlock()
	for _, ln := range bound {
		ln.Close() // connections already accepted carry on
	}
	log.Printf("draining listeners: the child took over")
}

// serve runs an HTTP server on ln, counting its connections under the
// listener stat name.
func (e *envoy) serve(ln net.Listener, statName string, h http.Handler) *http.Server {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ConnState: func(_ net.Conn, s http.ConnState) {
		e.mu.Lock()
		defer e.mu.Unlock()
		switch s {
		case http.StateNew:
			e.active[statName]++
		case http.StateClosed, http.StateHijacked:
			e.active[statName]--
		}
	}}
	e.mu.Lock()
	e.servers = append(e.servers, srv)
	e.active[statName] += 0
	e.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed && !errors.Is(err, net.ErrClosed) {
			log.Printf("listener %s: %v", statName, err)
		}
	}()
	return srv
}

// shutdown closes everything, gracefully for a short while.
func (e *envoy) shutdown() {
	e.cancel()
	e.closeRelays()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	e.mu.Lock()
	servers := e.servers
	e.mu.Unlock()
	for _, s := range servers {
		if err := s.Shutdown(ctx); err != nil {
			s.Close()
		}
	}
	e.wg.Wait()
}

// serverState is what /ready and /server_info report.
func (e *envoy) serverState() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.serverStateLocked()
}

func (e *envoy) serverStateLocked() int {
	switch {
	case e.healthFailed || e.hotDraining:
		return stateDraining
	case !e.workersStarted():
		return statePreInitializing
	}
	return stateLive
}

// workersStarted reports whether Envoy's workers have started: LIVE is
// that moment (startWorkers, which honours the readiness knobs).
func (e *envoy) workersStarted() bool {
	select {
	case <-e.workers:
		return true
	default:
		return false
	}
}

func (e *envoy) setStatLocked(name string, v int) { e.stats[name] = v }
func (e *envoy) bumpStatLocked(name string)       { e.stats[name]++ }
func (e *envoy) statLocked(name string) int       { return e.stats[name] }

// businessConnections is FAKE_ENVOY_ACTIVE_CONNECTIONS, counting down to 0
// over the drain time once a drain was requested; -1 if not set.
func (e *envoy) businessConnections() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := e.k.activeConnections
	if n <= 0 || e.drainStarted.IsZero() {
		return n
	}
	if e.k.drainTime <= 0 {
		return 0
	}
	left := 1 - float64(time.Since(e.drainStarted))/float64(e.k.drainTime)
	if left <= 0 {
		return 0
	}
	return int(float64(n)*left + 0.999)
}

// heldResource is a resource received outside the init types (a secret,
// say), as /config_dump shows it.
type heldResource struct {
	msg     proto.Message
	version string
	updated time.Time
}

// record stores a resource received over xDS or SDS for /config_dump; a nil
// m removes it.
func (e *envoy) record(typeURL, name, version string, m proto.Message) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.recordLocked(typeURL, name, version, m)
}

func (e *envoy) recordLocked(typeURL, name, version string, m proto.Message) {
	if e.received[typeURL] == nil {
		e.received[typeURL] = map[string]heldResource{}
	}
	if m == nil {
		delete(e.received[typeURL], name)
		return
	}
	e.received[typeURL][name] = heldResource{msg: m, version: version, updated: time.Now()}
}
