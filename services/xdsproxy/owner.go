package xdsproxy

import (
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/xdsproxy/lkg"
	"github.com/meshagent/meshagent/services/xdsproxy/protocol"
	"github.com/meshagent/meshagent/services/xdsproxy/rawxds"
	"github.com/meshagent/meshagent/services/xdsproxy/stallwatch"
)

// The proxy's state (proxyState) has one owner: a goroutine that Serve runs
// for as long as it does, and the only one that reads or writes the state
// (#26). The others send it messages over one channel, and the methods
// below are the whole set, so that nothing else reaches it. A stream's own
// part of the state (its protocol tracker, its stall watch: streamState) is
// reached the same way. Messages that change something are posted (the
// sender goes on; the channel's order is the order they apply in), those
// that need an answer wait for it.
//
// The owner never waits for anyone: it publishes to sinks, reports health,
// logs, and queues requests on a stream (which never blocks), so a stream
// waiting for the owner can never be what the owner waits for.

// ownerBacklog is how many posted messages may wait for the owner: the push
// path posts a few per response, and should not wait while the owner
// applies an acknowledged 10,000-resource response to the cache.
const ownerBacklog = 64

// owner runs one Serve's messages on the state.
type owner struct {
	state  *proxyState
	clock  messages.Clock
	events chan message
	quit   chan struct{} // closed by stop
	done   chan struct{} // closed when run returns
}

// message is one message to the owner. Those a stream sends for every
// request, response and Send are plain values of a kind, so that the push
// path allocates nothing for them; the others carry a function to run.
type message struct {
	kind msgKind
	do   func(*proxyState) // msgDo
	// The stream's messages: which stream, when it happened, and what.
	st      proxyStream
	now     time.Time
	typeURL string        // msgSendStart (the type asked for, if any), msgAnswered
	f       *rawxds.Frame // msgSending
	req     any           // msgObserved: Envoy's request, the stream's R
	record  bool          // msgObserved
	seq     uint64        // msgObserved: the request's number (outgoing.seq)
}

type msgKind uint8

const (
	msgDo        msgKind = iota
	msgObserved          // Envoy sent req (stream.observed)
	msgSending           // response f is on its way to Envoy
	msgSendStart         // a request is about to be sent upstream
	msgSendDone          // and was
	msgAnswered          // a response of typeURL arrived
)

// apply runs m on the state.
func (m *message) apply(s *proxyState) {
	switch m.kind {
	case msgDo:
		m.do(s)
	case msgObserved:
		m.st.observe(s, m.now, m.req, m.record, m.seq)
	case msgSending:
		m.st.tracked(s, m.now, m.f)
	case msgSendStart:
		w := m.st.stall()
		if m.typeURL != "" {
			w.Asked(m.now, m.typeURL)
		}
		w.SendStart(m.now)
	case msgSendDone:
		m.st.stall().SendDone(m.now)
	case msgAnswered:
		m.st.stall().Answered(m.now, m.typeURL)
	}
}

func newOwner(state *proxyState, clock messages.Clock) *owner {
	return &owner{state: state, clock: clock, events: make(chan message, ownerBacklog),
		quit: make(chan struct{}), done: make(chan struct{})}
}

// run applies messages until stop, then those already posted.
func (o *owner) run() {
	defer close(o.done)
	s := o.state
	// What belongs to the last run's streams does not carry over.
	s.current, s.currentPeer, s.replacedPID, s.stopping = nil, peerCred{}, 0, false
	for {
		select {
		case m := <-o.events:
			m.apply(s)
		case <-o.quit:
			for {
				select {
				case m := <-o.events:
					m.apply(s)
				default:
					return
				}
			}
		}
	}
}

// stop ends run once every goroutine that posts has returned (Serve's
// last step) and waits for it.
func (o *owner) stop() {
	close(o.quit)
	<-o.done
}

// send hands m to the owner. After stop (a gRPC handler that outlived
// Serve, which gRPC allows) it does nothing.
func (o *owner) send(m message) {
	select {
	case o.events <- m:
	case <-o.done:
	}
}

// post hands f to the owner, to run.
func (o *owner) post(f func(*proxyState)) { o.send(message{kind: msgDo, do: f}) }

// ask runs f on the owner and waits for it; false if the owner has
// stopped and f did not run.
func (o *owner) ask(f func(*proxyState)) bool {
	ran := make(chan struct{})
	o.post(func(s *proxyState) { f(s); close(ran) })
	select {
	case <-ran:
		return true
	case <-o.done:
		select {
		case <-ran:
			return true
		default:
			return false
		}
	}
}

// proxyStream is what the owner knows of a stream of either protocol: each
// method is called by the owner only, and never blocks.
type proxyStream interface {
	end(err error)
	// health queues a health report, if the stream's first requests went
	// out (streamState.initialSent).
	health(h messages.WorkloadHealth)
	// redial ends the stream's upstream so that it is dialled afresh
	// (roots.go).
	redial()
	// observe, tracked and stall apply the stream's messages.
	observe(s *proxyState, now time.Time, req any, record bool, seq uint64)
	tracked(s *proxyState, now time.Time, f *rawxds.Frame)
	stall() *stallwatch.Watch
}

// register makes st, opened by p, the active stream, and the status
// connecting; a newer stream replaces the older one (Istio keeps one
// connection: "registered overlapping stream"), if it comes from the same
// uid (mayReplace).
func (o *owner) register(st proxyStream, p peerCred) error {
	now := o.clock.Now()
	err := errShuttingDown
	o.ask(func(s *proxyState) {
		if s.stopping {
			return
		}
		old, oldPeer := s.current, s.currentPeer
		if old != nil {
			if p.pid == s.replacedPID && p.pid != oldPeer.pid {
				err = errReplaced(oldPeer, p)
				return
			}
			if err = mayReplace(oldPeer, p); err != nil {
				s.log.Warn("refused a stream on the XDS socket: it would replace Envoy's",
					"open_pid", oldPeer.pid, "open_uid", oldPeer.uid, "new_pid", p.pid, "new_uid", p.uid)
				return
			}
			s.log.Info("a newer Envoy stream replaces the open one",
				"open_pid", oldPeer.pid, "open_uid", oldPeer.uid, "new_pid", p.pid, "new_uid", p.uid)
			old.end(nil)
		}
		err = nil
		s.current, s.currentPeer = st, p
		s.replacedPID = 0
		if old != nil && oldPeer.pid != p.pid {
			s.replacedPID = oldPeer.pid
		}
		s.connecting(now)
	})
	return err
}

// unregister: st has ended; if it was the active stream, none is.
func (o *owner) unregister(st proxyStream) {
	now := o.clock.Now()
	o.post(func(s *proxyState) {
		if s.current == st {
			s.current, s.replacedPID = nil, 0
			s.idle(now)
		}
	})
}

// shutdown refuses new streams and ends the active one.
func (o *owner) shutdown() {
	o.ask(func(s *proxyState) {
		s.stopping = true
		if s.current != nil {
			s.current.end(errShuttingDown)
		}
	})
}

// redial ends the active stream's upstream so that the next one dials
// afresh; without an active stream, the next one will anyway.
func (o *owner) redial(reason, version string) {
	o.post(func(s *proxyState) {
		if s.current == nil {
			s.log.Info("no stream open; the next one dials the control plane afresh", "reason", reason, "bundle_version", version)
			return
		}
		s.log.Info("ending the upstream stream to redial the control plane; Envoy reconnects and resynchronises",
			"reason", reason, "bundle_version", version, "address", s.cfg.DiscoveryAddress)
		s.current.redial()
	})
}

// workloadHealth keeps the workload's health for the next streams and
// reports it on the active one.
func (o *owner) workloadHealth(h messages.WorkloadHealth) {
	o.post(func(s *proxyState) {
		s.lastHealth = &h
		if s.current != nil {
			s.current.health(h)
		}
	})
}

// The control plane's status (state.go).

func (o *owner) idle() {
	now := o.clock.Now()
	o.post(func(s *proxyState) { s.idle(now) })
}

func (o *owner) connected() {
	now := o.clock.Now()
	o.post(func(s *proxyState) { s.connected(now) })
}

func (o *owner) failed(err error, cached bool) {
	now := o.clock.Now()
	o.post(func(s *proxyState) { s.failed(now, err, cached) })
}

func (o *owner) probeFailed(err error) {
	o.post(func(s *proxyState) { s.probeFailed(err) })
}

// ack: the agent accepted a response of its own types.
func (o *owner) ack(typeURL, version string) {
	now := o.clock.Now()
	o.post(func(s *proxyState) { s.ack(now, typeURL, version) })
}

// sentCached: a response from the cache is on its way to Envoy.
func (o *owner) sentCached(f *rawxds.Frame) {
	now := o.clock.Now()
	o.post(func(s *proxyState) { s.sent(now, f) })
}

// The last-known-good configuration (package lkg).

// servable: which types the cache can serve on a stream of protocol m.
func (o *owner) servable(m lkg.Mode) []string {
	var types []string
	o.ask(func(s *proxyState) { types = s.cache.Servable(m) })
	return types
}

// putNames records the name table the agent accepted.
func (o *owner) putNames(b []byte, version string) {
	o.post(func(s *proxyState) { s.cache.PutNames(b, version) })
}

// cacheSnapshot is the cache's content now, for the writer.
func (o *owner) cacheSnapshot() lkg.Snapshot {
	var snap lkg.Snapshot
	o.ask(func(s *proxyState) { snap = s.cache.Snapshot() })
	return snap
}

// cacheChanged is signalled after the cache changes. The channel is the
// cache's, made with it and never replaced.
func (o *owner) cacheChanged() <-chan struct{} { return o.state.cache.Wake() }

// restore fills an empty cache from the file's snapshot, and says which
// types it can serve then.
func (o *owner) restore(snap lkg.Snapshot) []string {
	var types []string
	o.ask(func(s *proxyState) {
		s.cache.Restore(snap)
		types = s.cache.Servable(snap.Mode)
	})
	return types
}

// streamState is a stream's own part of the proxy's state: only the owner
// touches it, through the stream's methods below.
type streamState[R protocol.Request] struct {
	tr    protocol.Tracker[R]
	stall *stallwatch.Watch
	// initialSent: the agent's own requests went out after Envoy's first
	// LDS request.
	initialSent bool
	// observedSeq is the number of Envoy's last request observed;
	// agentSeq, of the agent's last request queued (outgoing.seq).
	observedSeq, agentSeq uint64
}

// observed: Envoy sent req. The tracker learns its subscriptions and ACKs
// (feeding the cache when record is set), and the status the ACK or NACK.
func (st *stream[R]) observed(req R, record bool, seq uint64) {
	st.own.send(message{kind: msgObserved, st: st, now: st.own.clock.Now(), req: req, record: record, seq: seq})
}

func (st *stream[R]) observe(s *proxyState, now time.Time, r any, record bool, seq uint64) {
	req := r.(R)
	st.owned.observedSeq = seq
	info := st.owned.tr.Observe(req, record, s.cache)
	if info.Acked {
		s.ack(now, info.TypeURL, info.Version)
	}
	if info.Nack != "" {
		nonce := req.GetResponseNonce()
		version := s.nacked(now, info.TypeURL, nonce, info.Nack)
		st.log.Warn("Envoy rejected a configuration (NACK)", "type_url", info.TypeURL, "version", version,
			"nonce", nonce, "error", info.Nack)
	}
}

// sendInitial queues the agent's own requests after Envoy's first LDS
// request, as Istio does: NDS, ProxyConfig, and the last health report.
// It returns once they are queued, so that they go before what Envoy
// sends next.
func (st *stream[R]) sendInitial() {
	st.own.ask(func(s *proxyState) {
		if st.owned.initialSent {
			return
		}
		st.owned.initialSent = true
		for _, r := range st.initialRequests(s) {
			st.enqueueAgent(r)
		}
	})
}

// initialRequests are the agent's own first requests on an upstream
// stream: NDS, ProxyConfig, and the last health report. Called by the
// owner.
func (st *stream[R]) initialRequests(s *proxyState) []R {
	cfg := st.svc.cfg
	var out []R
	if cfg.NDS {
		out = append(out, st.pr.AgentRequest(nameTableType, "", "", nil))
	}
	if cfg.ProxyConfigXDS {
		out = append(out, st.pr.AgentRequest(proxyConfigType, "", "", nil))
	}
	if cfg.HealthUpdates && s.lastHealth != nil {
		out = append(out, st.healthRequest(*s.lastHealth))
	}
	return out
}

// enqueueAgent queues one of the agent's own requests, numbered (outgoing.seq).
// Called by the owner.
func (st *stream[R]) enqueueAgent(req R) {
	st.owned.agentSeq++
	st.enqueue(outgoing[R]{req: req, agent: true, seq: st.owned.agentSeq})
}

// health queues a health report, if the agent's first requests went out
// (the control plane learns the node from Envoy's first; Istio waits for
// the first LDS request). Called by the owner.
func (st *stream[R]) health(h messages.WorkloadHealth) {
	if st.owned.initialSent {
		st.enqueueAgent(st.healthRequest(h))
	}
}

// sending: response f is on its way to Envoy.
func (st *stream[R]) sending(f *rawxds.Frame) {
	st.own.send(message{kind: msgSending, st: st, now: st.own.clock.Now(), f: f})
}

func (st *stream[R]) tracked(s *proxyState, now time.Time, f *rawxds.Frame) {
	st.owned.tr.Sending(f, s.cache)
	s.sent(now, f)
}

// probeRequest is Envoy's first request, as a fresh subscription.
func (st *stream[R]) probeRequest() R {
	var r R
	st.own.ask(func(*proxyState) { r = st.owned.tr.ProbeRequest() })
	return r
}

// replay answers, from the cache, every type Envoy asked for so far.
func (st *stream[R]) replay() []*rawxds.Frame {
	var out []*rawxds.Frame
	st.own.ask(func(s *proxyState) { out = st.owned.tr.Replay(s.cache) })
	return out
}

// answer answers one more of Envoy's requests from the cache.
func (st *stream[R]) answer(req R) []*rawxds.Frame {
	var out []*rawxds.Frame
	st.own.ask(func(s *proxyState) { out = st.owned.tr.Answer(req, s.cache) })
	return out
}

// The stall watch (stall.go). The time is read where the event happens, as
// the watch would have read it.

// sendStart: a request is about to be sent upstream; asked, when Envoy's
// request needs an answer, names its type.
func (st *stream[R]) sendStart(asked string) {
	st.own.send(message{kind: msgSendStart, st: st, now: st.own.clock.Now(), typeURL: asked})
}

func (st *stream[R]) sendDone() {
	st.own.send(message{kind: msgSendDone, st: st, now: st.own.clock.Now()})
}

// answered: a response of typeURL arrived.
func (st *stream[R]) answered(typeURL string) {
	st.own.send(message{kind: msgAnswered, st: st, now: st.own.clock.Now(), typeURL: typeURL})
}

func (st *stream[R]) stall() *stallwatch.Watch { return st.owned.stall }

// stalled is the stall error when requests have waited too long;
// delivering: responses wait for Envoy.
func (st *stream[R]) stalled(delivering bool) error {
	now := st.own.clock.Now()
	var err error
	st.own.ask(func(*proxyState) { err = st.stall().Stalled(now, delivering) })
	return err
}
