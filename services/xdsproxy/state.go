package xdsproxy

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
)

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
	svc *Service

	mu    sync.Mutex
	state messages.XDSState
	// failing: the last attempt to use the control plane failed, and no
	// stream has worked since; unreachableSince is when that began.
	failing          bool
	unreachableSince time.Time
	servingCache     bool
}

func newUpstreamStatus(s *Service) *upstreamStatus {
	return &upstreamStatus{svc: s, state: messages.XDSState{Address: s.cfg.DiscoveryAddress, LastACK: map[string]string{},
		Types: map[string]messages.XDSTypeState{}}}
}

// set changes the upstream state and publishes.
func (u *upstreamStatus) set(up messages.XDSUpstream, since time.Time) {
	if u.state.Upstream != up || u.state.Since.IsZero() {
		u.state.Upstream, u.state.Since = up, since
	}
}

// idle: no stream from Envoy. A failing control plane stays down: the
// next Envoy stream will find it so.
func (u *upstreamStatus) idle() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.leaveCache()
	if u.failing {
		u.set(messages.XDSDown, u.unreachableSince)
	} else {
		u.set(messages.XDSIdle, u.svc.clock.Now())
	}
	u.publish()
}

// connecting: an Envoy stream opened and the upstream one is being set
// up. While the control plane is failing, the state stays what it is
// (down, or serving the cache) until a stream works: Envoy retries
// several times a second, and the state would flap with it.
func (u *upstreamStatus) connecting() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.failing {
		return
	}
	u.set(messages.XDSConnecting, u.svc.clock.Now())
	u.publish()
}

// connected: the control plane answered on the stream.
func (u *upstreamStatus) connected() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.failing {
		u.svc.log.Info("control plane reachable again", "address", u.svc.cfg.DiscoveryAddress,
			"unreachable_for", u.svc.clock.Now().Sub(u.unreachableSince).Round(time.Millisecond))
	}
	u.failing, u.unreachableSince = false, time.Time{}
	u.leaveCache()
	u.set(messages.XDSConnected, u.svc.clock.Now())
	u.publish()
}

// failed: the control plane could not be reached, refused the stream, or
// dropped it. cached says whether Envoy is being served the cache.
func (u *upstreamStatus) failed(err error, cached bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := u.svc.clock.Now()
	if !u.failing {
		u.failing, u.unreachableSince = true, now
	}
	u.state.LastError = u.svc.describe(err)
	if cached {
		if !u.servingCache {
			u.servingCache = true
			u.svc.m.servingCache.Set(1)
			u.svc.log.Warn("serving cached configuration, control plane unreachable",
				"address", u.svc.cfg.DiscoveryAddress, "since", u.unreachableSince.Format(time.RFC3339), "error", u.state.LastError)
		}
		u.set(messages.XDSServingCache, u.unreachableSince)
	} else {
		u.leaveCache()
		u.set(messages.XDSDown, u.unreachableSince)
	}
	u.publish()
}

// probeFailed: a new attempt failed while the cache is served.
func (u *upstreamStatus) probeFailed(err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if d := u.svc.describe(err); d != u.state.LastError {
		u.state.LastError = d
		u.publish()
	}
}

func (u *upstreamStatus) leaveCache() {
	if u.servingCache {
		u.servingCache = false
		u.svc.m.servingCache.Set(0)
	}
}

// ack records the version Envoy acknowledged for a type. An ACK of the
// last response sent ends a NACK's reign: Envoy took a later version.
func (u *upstreamStatus) ack(typeURL, version string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	t, known := u.state.Types[typeURL]
	cleared := false
	if t.NACK != nil && version == t.SentVersion && version != t.NACK.Version {
		t.NACK, cleared = nil, true
	}
	if known && (t.ACKedVersion != version || cleared) {
		t.ACKedVersion, t.ACKedAt = version, u.svc.clock.Now()
		u.state.Types[typeURL] = t
	}
	if v, ok := u.state.LastACK[typeURL]; ok && v == version && !cleared {
		return
	}
	u.state.LastACK[typeURL] = version
	u.publishState()
}

// sent records a response on its way to Envoy (issue 22: what the control
// plane last sent, for proxy-status).
func (u *upstreamStatus) sent(f *frame) {
	if typeLabel(f.typeURL) == "other" {
		return // a type URL nobody knows must not grow the state
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	t := u.state.Types[f.typeURL]
	t.SentVersion, t.SentNonce, t.SentResources, t.SentAt = f.version, f.nonce, f.resources, u.svc.clock.Now()
	u.state.Types[f.typeURL] = t
	u.publishState()
}

// nacked records Envoy's rejection of the response with nonce, and
// returns the rejected version when it is the last one sent ("" if not
// known). Each NACK is logged once by the stream and counted here.
func (u *upstreamStatus) nacked(typeURL, nonce, msg string) string {
	if typeLabel(typeURL) == "other" {
		return ""
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	t := u.state.Types[typeURL]
	n := &messages.XDSNack{Nonce: nonce, Error: msg, At: u.svc.clock.Now()}
	if nonce != "" && nonce == t.SentNonce {
		n.Version = t.SentVersion
	}
	t.NACK = n
	t.NACKs++
	u.state.Types[typeURL] = t
	u.svc.m.nacks.WithLabelValues(typeLabel(typeURL)).Inc()
	u.publishState()
	return n.Version
}

// publish sends XDSState and the matching Health, under u.mu.
func (u *upstreamStatus) publish() {
	u.publishState()
	if !u.failing {
		u.svc.health.Report(messages.Ready, "")
		return
	}
	since := u.unreachableSince.Format(time.RFC3339)
	if u.servingCache {
		u.svc.health.Report(messages.Degraded, fmt.Sprintf("serving cached configuration, control plane %s unreachable since %s: %s",
			u.svc.cfg.DiscoveryAddress, since, u.state.LastError))
		return
	}
	u.svc.health.Report(messages.Degraded, fmt.Sprintf("control plane %s unreachable since %s: %s",
		u.svc.cfg.DiscoveryAddress, since, u.state.LastError))
}

func (u *upstreamStatus) publishState() {
	st := u.state
	st.LastACK = maps.Clone(u.state.LastACK)
	st.Types = make(map[string]messages.XDSTypeState, len(u.state.Types))
	for k, t := range u.state.Types {
		if t.NACK != nil {
			n := *t.NACK
			t.NACK = &n
		}
		st.Types[k] = t
	}
	u.svc.out.State.Send(st)
}

// describe turns an upstream error into what an operator needs to read:
// the two mistakes that look alike from afar, a refused token and an
// unverifiable certificate, say so and name the file to check.
func (s *Service) describe(err error) string {
	if err == nil {
		return ""
	}
	var stall *stallError
	if errors.As(err, &stall) {
		return stall.Error()
	}
	st, _ := status.FromError(err)
	msg := st.Message()
	switch {
	case st.Code() == codes.Unauthenticated || st.Code() == codes.PermissionDenied:
		tok := "no token file configured"
		if s.cfg.TokenFile != "" {
			tok = "token from " + s.cfg.TokenFile
		}
		return fmt.Sprintf("control plane rejected the agent's credentials (%s): %s: %s", tok, st.Code(), msg)
	case strings.Contains(msg, "authentication handshake failed"):
		return fmt.Sprintf("TLS handshake with the control plane failed (roots: %s, server name %q): %s", s.rootsDescription(), s.cfg.serverName(), msg)
	case st.Code() == codes.Unknown:
		return err.Error()
	}
	return fmt.Sprintf("%s: %s", st.Code(), msg)
}

// rootsDescription names where the roots came from, for errors.
func (s *Service) rootsDescription() string {
	switch s.cfg.Roots {
	case RootsFile:
		return s.cfg.RootCAFile
	case RootsSystem:
		return "system roots (XDS_ROOT_CA=SYSTEM)"
	case RootsCertBundle:
		return "the file-mounted certificates' roots"
	}
	return s.cfg.Roots.String()
}
