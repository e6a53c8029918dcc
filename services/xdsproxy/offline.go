package xdsproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
)

// Serving the last-known-good configuration. When an Envoy connects and
// the control plane cannot be reached, Istio's proxy ends the stream and
// Envoy retries for as long as the outage lasts: an Envoy that restarted
// in place (or a new one after an agent restart) stays empty and not
// ready. This proxy instead answers Envoy from the cache, with nonces of
// its own, consumes Envoy's ACKs locally, and keeps trying the control
// plane with backoff. As soon as the control plane answers, Envoy's stream
// moves to it, open (reattach.go, #24): the proxy resubscribes on Envoy's
// behalf with what Envoy holds, as Envoy would on a new stream, and the
// control plane's responses flow to Envoy on the same stream, with no
// retry of Envoy's to wait for. If the control plane fails again during
// the move, Envoy's stream ends (Unavailable): Envoy keeps its
// configuration across a reconnect and resynchronises on the next stream.

// canServeCache waits for Envoy's first request (it names the node) and
// reports whether the cache holds this node's configuration for this
// protocol.
func (st *stream[R]) canServeCache() bool {
	s := st.svc
	if !s.cfg.OfflineCache {
		return false
	}
	select {
	case <-st.firstReq:
	case <-st.readDone:
		return false
	case <-st.ended:
		return false
	}
	return s.records(st.node) && len(st.own.servable(st.pr.Mode())) > 0
}

// serveCache serves the cache on this stream until the control plane is
// back, Envoy leaves, or the stream is ended.
func (st *stream[R]) serveCache(cause error) error {
	s := st.svc
	st.own.failed(cause, true)
	st.log.Warn("serving cached configuration to Envoy: control plane unreachable",
		"address", s.cfg.DiscoveryAddress, "types", st.own.servable(st.pr.Mode()), "error", s.cfg.describe(cause))
	for _, f := range st.replay() {
		if err := st.sendCached(f); err != nil {
			return envoyError(err)
		}
	}
	ctx, cancel := context.WithCancel(st.down.Context())
	back := make(chan struct{})
	probed := make(chan struct{})
	go func() { defer close(probed); st.probe(ctx, back, cause) }()
	defer func() { cancel(); <-probed }()

	for {
		select {
		case <-st.requests.Ready():
			for _, o := range st.requests.Take() {
				if o.agent {
					continue // NDS and the others wait for the control plane
				}
				for _, f := range st.answer(o.req) {
					if err := st.sendCached(f); err != nil {
						return envoyError(err)
					}
				}
			}
		case <-back:
			return st.reattach()
		case <-st.readDone:
			return envoyError(st.readErr)
		case <-st.ended:
			return st.endErr
		}
	}
}

func (st *stream[R]) sendCached(f *rawxds.Frame) error {
	label := typeLabel(f.TypeURL)
	st.svc.m.messages.WithLabelValues(label, dirCache).Inc()
	st.svc.m.bytes.WithLabelValues(label, dirCache).Add(float64(f.Body.Len()))
	st.log.Debug("served from the cache", "type_url", f.TypeURL, "version", f.Version, "nonce", f.Nonce)
	st.own.sentCached(f)
	return st.down.SendMsg(f)
}

// steadyProbing is how long after an outage begins the control plane is
// probed at the base pace (ReconnectBackoff, jittered) before the delay
// starts doubling. An istiod that restarts (a rollout, a crash) is back
// within seconds; doubling from the first attempt made the agent find it
// up to a few seconds late (the end-to-end test on Istio's istiod: 1.9 s
// after istiod's start, where Istio's agent, redialling on each of Envoy's
// retries, took 0.6 s). At 500 ms that is about 20 dials in the window, a
// refused dial costing the control plane nothing; longer outages back
// off to ReconnectBackoffMax as before.
const steadyProbing = 10 * time.Second

// refusedPace divides the probe delay while the control plane's port
// refuses connections, within steadyProbing (#24): a refused connect
// costs the control plane nothing (its kernel answers), and the agent
// then finds a restarted istiod about 50 ms after it listens instead of
// 250 ms on average (half the 500 ms pace; Istio's agent, redialling on
// each of Envoy's retries, is as late as Envoy's retry). A probe that
// connects and fails (istiod up but not serving yet, a TLS error) is
// followed by the full delay: the control plane pays for those.
const refusedPace = 5

// probeWait is the wait before the next probe, the delay being delay and
// the outage having lasted for unreachable, after a probe that failed with
// err: a refusedPace-th of it while the port refuses connections, within
// steadyProbing.
func probeWait(delay, unreachable time.Duration, err error) time.Duration {
	if isRefused(err) && unreachable < steadyProbing {
		return delay / refusedPace
	}
	return delay
}

// isRefused reports whether a probe failed at the TCP connect, refused:
// gRPC reports it as Unavailable with the dialer's error as text only.
func isRefused(err error) bool {
	return status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "connection refused")
}

// probe tries the control plane until it answers (then closes back) or
// ctx ends: at the base pace for steadyProbing (faster while the port
// refuses connections: refusedPace), then with exponential backoff; always
// with jitter. cause is why the cache is served: the first failure.
func (st *stream[R]) probe(ctx context.Context, back chan<- struct{}, cause error) {
	s := st.svc
	delay := s.cfg.ReconnectBackoff
	began := s.clock.Now()
	wait := probeWait(delay, 0, cause)
	for attempt := 1; ; attempt++ {
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(jitter(wait)):
		case <-st.redialed:
			// New roots may be what the control plane needed (#26):
			// try them now, and back off from the start again.
			delay, began = s.cfg.ReconnectBackoff, s.clock.Now()
		}
		err := st.probeOnce(ctx)
		if err == nil {
			st.own.connected()
			close(back)
			return
		}
		if ctx.Err() != nil {
			return
		}
		st.own.probeFailed(err)
		unreachable := s.clock.Now().Sub(began)
		wait = probeWait(delay, unreachable, err)
		st.log.Debug("control plane still unreachable", "attempt", attempt, "delay", wait, "error", err)
		delay = s.cfg.nextProbeDelay(delay, unreachable)
	}
}

// nextProbeDelay is the delay after one of delay, the outage having
// lasted for unreachable: unchanged during steadyProbing, then doubled up
// to ReconnectBackoffMax.
func (c Config) nextProbeDelay(delay, unreachable time.Duration) time.Duration {
	if unreachable < steadyProbing {
		return delay
	}
	return min(delay*2, c.ReconnectBackoffMax)
}

var errNoAnswer = errors.New("the control plane accepted the stream but did not answer")

// probeOnce opens a stream and sends Envoy's first request as a fresh
// subscription: the control plane is back when it answers (a stream that
// opens and then refuses the token is not back).
func (st *stream[R]) probeOnce(ctx context.Context) error {
	s := st.svc
	up, err := s.openUpstream(ctx, st.pr.Method())
	if err != nil {
		s.m.istiodFailures.Inc()
		return err
	}
	got := make(chan error, 1)
	go func() {
		if err := up.stream.SendMsg(st.probeRequest()); err != nil && !errors.Is(err, io.EOF) {
			got <- err
			return
		}
		got <- up.stream.RecvMsg(new(rawxds.Frame))
	}()
	var res error
	received := false
	select {
	case res = <-got:
		received = true
		if errors.Is(res, io.EOF) {
			res = errNoAnswer
		}
	case <-s.clock.After(s.cfg.StallTimeout):
		res = fmt.Errorf("%w within %v", errNoAnswer, s.cfg.StallTimeout)
	case <-ctx.Done():
		res = ctx.Err()
	}
	if res == nil {
		// Envoy's reconnection opens its stream on this connection
		// (warmconn.go).
		s.warm.put(up.release())
	} else {
		up.close()
	}
	if !received {
		<-got // the goroutine returns once the stream is closed
	}
	return res
}

// jitter spreads retries by ±20%, so that the agents of a cluster do not
// reach a recovering control plane all at once.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}
