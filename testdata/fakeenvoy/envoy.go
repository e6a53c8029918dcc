package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
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
	started   time.Time
	adminAddr string

	mu           sync.Mutex
	healthFailed bool
	drains       []string // raw queries of POST /drain_listeners
	drainStarted time.Time
	active       map[string]int // listener stat name -> open connections
	received     map[string]map[string]any
	// received: type URL -> resource name -> resource as JSON-able value,
	// for what is not in xds (secrets, other types).
	xds *xdsConfig
	// stats are the counters and gauges written so far, by Envoy name:
	// /stats?usedonly shows exactly these.
	stats map[string]int

	servers []*http.Server
	relays  relays // the capture listeners (relay.go)
	wg      sync.WaitGroup
	cancel  context.CancelFunc
}

func newEnvoy(boot *bootstrapv3.Bootstrap, k knobs) *envoy {
	return &envoy{boot: boot, k: k, started: time.Now(), active: map[string]int{}, received: map[string]map[string]any{},
		xds: newXDSConfig(), stats: map[string]int{}}
}

// start opens the admin API and the static listeners and starts the xDS and
// SDS clients. A listener that cannot be opened is fatal, as in Envoy.
// exit receives a code when the fake must exit (POST /quitquitquit).
func (e *envoy) start(ctx context.Context, exit chan<- int) error {
	ctx, e.cancel = context.WithCancel(ctx)
	sa := e.boot.GetAdmin().GetAddress().GetSocketAddress()
	addr := net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("admin address %s: %w", addr, err)
	}
	e.adminAddr = ln.Addr().String()
	e.serve(ln, "admin", e.adminMux(exit))

	if err := e.startListeners(); err != nil {
		return err
	}
	e.reconcileRelays()
	e.startInit()
	e.startXDS(ctx)
	return nil
}

// serve runs an HTTP server on ln, counting its connections under the
// listener stat name.
func (e *envoy) serve(ln net.Listener, statName string, h http.Handler) {
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
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			log.Printf("listener %s: %v", statName, err)
		}
	}()
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
	case e.healthFailed:
		return stateDraining
	case !e.xds.live || e.k.neverReady || time.Since(e.started) < e.k.readyAfter:
		return statePreInitializing
	}
	return stateLive
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

// record stores a resource received over xDS or SDS for /config_dump.
func (e *envoy) record(typeURL, name string, m proto.Message) {
	v := any(nil)
	if m != nil {
		if raw, err := protojson.Marshal(m); err == nil {
			v = jsonRaw(raw)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.received[typeURL] == nil {
		e.received[typeURL] = map[string]any{}
	}
	if m == nil {
		delete(e.received[typeURL], name)
		return
	}
	e.received[typeURL][name] = v
}
