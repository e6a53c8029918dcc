package xdsproxy

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/xdsproxy/lkg"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
	"github.com/meshagent/meshagent/services/xdsproxy/stallwatch"
)

// proxyState is everything the proxy knows that more than one goroutine
// needs: the control plane's status, the last-known-good configuration, the
// workload's last health, and which Envoy stream is the active one. It has
// no lock: one goroutine owns it (owner.go), and every other goroutine asks
// that one, as services/sds/store.go does (#26: there were seven mutexes,
// one guarding four unrelated fields). It outlives a Serve: the cache, the
// status and the last health carry over to the next run.
type proxyState struct {
	log    *slog.Logger
	m      *metrics
	health *messages.Reporter
	out    messages.Sink[messages.XDSState]
	cfg    Config // for describe and the address in messages

	status upstreamStatus
	cache  *lkg.Cache
	// lastHealth is the workload's last health, resent on every new
	// upstream stream (Istio does).
	lastHealth *messages.WorkloadHealth

	// The run's Envoy streams: current is the active one, opened by
	// currentPeer; stopping refuses new ones while Serve shuts down.
	current     proxyStream
	currentPeer peerCred
	// replacedPID is the process whose stream the current one replaced:
	// during an Envoy hot restart (#25) the old epoch reconnects and would
	// take the stream back, and the two would replace each other until the
	// old one exits. 0: none.
	replacedPID int32
	stopping    bool
}

// upstreamStatus is what the proxy says about its control plane: XDSState
// for the status server, and its own Health.
//
// Health is Ready when an upstream stream works, or while no Envoy has
// connected (there is nothing to proxy yet). Once the control plane fails
// it is Degraded, with the reason (a wrong token, a bad root, unreachable
// since T, serving the cache), until a stream works again. Degraded still
// counts as serving: Istio's agent never fails readiness on the control
// plane (Envoy keeps its configuration through an outage), and neither does
// this one; the reason is what an operator reads in /healthz/ready's body
// and /debug/tree.
type upstreamStatus struct {
	state messages.XDSState
	// failing: the last attempt to use the control plane failed, and no
	// stream has worked since; unreachableSince is when that began.
	failing          bool
	unreachableSince time.Time
	servingCache     bool
}

func newProxyState(cfg Config, log *slog.Logger, m *metrics, health *messages.Reporter, out messages.Sink[messages.XDSState]) *proxyState {
	return &proxyState{
		log: log, m: m, health: health, out: out, cfg: cfg,
		status: upstreamStatus{state: messages.XDSState{Address: cfg.DiscoveryAddress, LastACK: map[string]string{},
			Types: map[string]messages.XDSTypeState{}}},
		cache: lkg.New(cfg.CacheMaxBytes, log),
	}
}

// set changes the upstream state; the caller publishes.
func (u *upstreamStatus) set(up messages.XDSUpstream, since time.Time) {
	if u.state.Upstream != up || u.state.Since.IsZero() {
		u.state.Upstream, u.state.Since = up, since
	}
}

// idle: no stream from Envoy. A failing control plane stays down: the
// next Envoy stream will find it so.
func (p *proxyState) idle(now time.Time) {
	u := &p.status
	p.leaveCache()
	if u.failing {
		u.set(messages.XDSDown, u.unreachableSince)
	} else {
		u.set(messages.XDSIdle, now)
	}
	p.publish()
}

// connecting: an Envoy stream opened and the upstream one is being set
// up. While the control plane is failing, the state stays what it is
// (down, or serving the cache) until a stream works: Envoy retries
// several times a second, and the state would flap with it.
func (p *proxyState) connecting(now time.Time) {
	if p.status.failing {
		return
	}
	p.status.set(messages.XDSConnecting, now)
	p.publish()
}

// connected: the control plane answered on the stream.
func (p *proxyState) connected(now time.Time) {
	u := &p.status
	if u.failing {
		p.log.Info("control plane reachable again", "address", p.cfg.DiscoveryAddress,
			"unreachable_for", now.Sub(u.unreachableSince).Round(time.Millisecond))
	}
	u.failing, u.unreachableSince = false, time.Time{}
	p.leaveCache()
	u.set(messages.XDSConnected, now)
	p.publish()
}

// failed: the control plane could not be reached, refused the stream, or
// dropped it. cached says whether Envoy is being served the cache.
func (p *proxyState) failed(now time.Time, err error, cached bool) {
	u := &p.status
	if !u.failing {
		u.failing, u.unreachableSince = true, now
	}
	u.state.LastError = p.cfg.describe(err)
	if cached {
		if !u.servingCache {
			u.servingCache = true
			p.m.servingCache.Set(1)
			p.log.Warn("serving cached configuration, control plane unreachable",
				"address", p.cfg.DiscoveryAddress, "since", u.unreachableSince.Format(time.RFC3339), "error", u.state.LastError)
		}
		u.set(messages.XDSServingCache, u.unreachableSince)
	} else {
		p.leaveCache()
		u.set(messages.XDSDown, u.unreachableSince)
	}
	p.publish()
}

// probeFailed: a new attempt failed while the cache is served.
func (p *proxyState) probeFailed(err error) {
	if d := p.cfg.describe(err); d != p.status.state.LastError {
		p.status.state.LastError = d
		p.publish()
	}
}

func (p *proxyState) leaveCache() {
	if p.status.servingCache {
		p.status.servingCache = false
		p.m.servingCache.Set(0)
	}
}

// ack records the version Envoy acknowledged for a type. An ACK of the
// last response sent ends a NACK's reign: Envoy took a later version.
func (p *proxyState) ack(now time.Time, typeURL, version string) {
	u := &p.status
	t, known := u.state.Types[typeURL]
	cleared := false
	if t.NACK != nil && version == t.SentVersion && version != t.NACK.Version {
		t.NACK, cleared = nil, true
	}
	if known && (t.ACKedVersion != version || cleared) {
		t.ACKedVersion, t.ACKedAt = version, now
		u.state.Types[typeURL] = t
	}
	if v, ok := u.state.LastACK[typeURL]; ok && v == version && !cleared {
		return
	}
	u.state.LastACK[typeURL] = version
	p.publishState()
}

// sent records a response on its way to Envoy (issue 22: what the control
// plane last sent, for proxy-status).
func (p *proxyState) sent(now time.Time, f *rawxds.Frame) {
	if typeLabel(f.TypeURL) == "other" {
		return // a type URL nobody knows must not grow the state
	}
	t := p.status.state.Types[f.TypeURL]
	t.SentVersion, t.SentNonce, t.SentResources, t.SentAt = f.Version, f.Nonce, f.Resources, now
	p.status.state.Types[f.TypeURL] = t
	p.publishState()
}

// nacked records Envoy's rejection of the response with nonce, and
// returns the rejected version when it is the last one sent ("" if not
// known). Each NACK is logged once by the caller and counted here.
func (p *proxyState) nacked(now time.Time, typeURL, nonce, msg string) string {
	if typeLabel(typeURL) == "other" {
		return ""
	}
	t := p.status.state.Types[typeURL]
	n := &messages.XDSNack{Nonce: nonce, Error: msg, At: now}
	if nonce != "" && nonce == t.SentNonce {
		n.Version = t.SentVersion
	}
	t.NACK = n
	t.NACKs++
	p.status.state.Types[typeURL] = t
	p.m.nacks.WithLabelValues(typeLabel(typeURL)).Inc()
	p.publishState()
	return n.Version
}

// publish sends XDSState and the matching Health.
func (p *proxyState) publish() {
	u := &p.status
	p.publishState()
	if !u.failing {
		p.health.Report(messages.Ready, "")
		return
	}
	since := u.unreachableSince.Format(time.RFC3339)
	if u.servingCache {
		p.health.Report(messages.Degraded, fmt.Sprintf("serving cached configuration, control plane %s unreachable since %s: %s",
			p.cfg.DiscoveryAddress, since, u.state.LastError))
		return
	}
	p.health.Report(messages.Degraded, fmt.Sprintf("control plane %s unreachable since %s: %s",
		p.cfg.DiscoveryAddress, since, u.state.LastError))
}

// publishState sends a copy of XDSState: the status server keeps it while
// the owner goes on changing its own.
func (p *proxyState) publishState() {
	st := p.status.state
	st.LastACK = maps.Clone(p.status.state.LastACK)
	st.Types = make(map[string]messages.XDSTypeState, len(p.status.state.Types))
	for k, t := range p.status.state.Types {
		if t.NACK != nil {
			n := *t.NACK
			t.NACK = &n
		}
		st.Types[k] = t
	}
	p.out.Send(st)
}

// describe turns an upstream error into what an operator needs to read:
// the two mistakes that look alike from afar, a refused token and an
// unverifiable certificate, say so and name the file to check.
func (c Config) describe(err error) string {
	if err == nil {
		return ""
	}
	var stall *stallwatch.Error
	if errors.As(err, &stall) {
		return stall.Error()
	}
	st, _ := status.FromError(err)
	msg := st.Message()
	switch {
	case st.Code() == codes.Unauthenticated || st.Code() == codes.PermissionDenied:
		tok := "no token file configured"
		if c.TokenFile != "" {
			tok = "token from " + c.TokenFile
		}
		return fmt.Sprintf("control plane rejected the agent's credentials (%s): %s: %s", tok, st.Code(), msg)
	case strings.Contains(msg, "authentication handshake failed"):
		return fmt.Sprintf("TLS handshake with the control plane failed (roots: %s, server name %q): %s", c.rootsDescription(), c.serverName(), msg)
	case st.Code() == codes.Unknown:
		return err.Error()
	}
	return fmt.Sprintf("%s: %s", st.Code(), msg)
}

// rootsDescription names where the roots came from, for errors.
func (c Config) rootsDescription() string {
	switch c.Roots {
	case RootsFile:
		return c.RootCAFile
	case RootsSystem:
		return "system roots (XDS_ROOT_CA=SYSTEM)"
	case RootsCertBundle:
		return "the file-mounted certificates' roots"
	}
	return c.Roots.String()
}
