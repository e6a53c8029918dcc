package envoy

import (
	"context"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/envoy/bootstrap"
)

// The agent's readiness, told to Envoy (#36).
//
// The kubelet probes the sidecar on Envoy's :15021 (Istio's injected
// readiness and startup probes), and Istio's bootstrap forwards every probe
// to the agent's status port: at a probe a second that was most of the
// agent's CPU at idle. The bootstrap the agent writes answers /healthz/ready
// in Envoy instead while the runtime key bootstrap.ReadinessKey is 100, and
// forwards it to the agent while it is 0 or absent (a fresh Envoy). The
// relay below keeps the key equal to the agent's verdict: 100 while the
// agent is ready (its /healthz/ready answers 200) and this Envoy is the
// ready one, 0 otherwise, set through POST /runtime_modify. So the kubelet
// sees the agent's verdict either way, the agent's reasons when it is not
// ready, and the agent wakes for a probe only then.

// The wait between two attempts to set the key while Envoy's admin API
// does not take it: doubling from relayRetryFirst up to relayRetryMax.
const (
	relayRetryFirst = 100 * time.Millisecond
	relayRetryMax   = 5 * time.Second
)

// readinessRelay sets bootstrap.ReadinessKey in the serving Envoy. Its
// goroutine owns what it last set; the run tells it each EnvoyState it
// publishes (envoy), and it watches the agent's readiness itself.
type readinessRelay struct {
	states chan messages.EnvoyState // one value; a newer one replaces it
	// answers tells the run whether the serving Envoy answers the
	// kubelet's probe itself, for the envoy line of /debug/tree; one
	// value, a newer one replaces it.
	answers chan bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// startRelay starts the relay of one Serve call; nil when the bootstrap
// does not read the key or nothing publishes the agent's readiness.
func (s *Service) startRelay(ctx context.Context) *readinessRelay {
	if s.agentReady == nil || s.cfg.Bootstrap == nil || !s.cfg.Bootstrap.ReadinessInEnvoy() {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &readinessRelay{states: make(chan messages.EnvoyState, 1), answers: make(chan bool, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		s.relayReadiness(ctx, r.states, r.answers)
	}()
	return r
}

// envoy hands the relay the run's newest EnvoyState, never blocking.
func (r *readinessRelay) envoy(st messages.EnvoyState) {
	if r == nil {
		return
	}
	sendLatest(r.states, st)
}

// answered is where the relay says who answers the kubelet's probe: true
// while the serving Envoy does, false when the probes go to the agent
// again; nil (never ready) without a relay.
func (r *readinessRelay) answered() <-chan bool {
	if r == nil {
		return nil
	}
	return r.answers
}

// stop ends the relay and waits for it.
func (r *readinessRelay) stop() {
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
}

// relayed is what the key holds in one Envoy process, as far as the relay
// knows: a process it has not yet set holds nothing, which reads as 0.
type relayed struct {
	epoch int
	ready bool
}

// relayReadiness keeps the serving Envoy's key equal to the agent's verdict
// until ctx is done. Serve hands it the first EnvoyState as it starts it. A
// failed attempt is retried with a doubling wait; a change meanwhile is
// tried at once.
func (s *Service) relayReadiness(ctx context.Context, states <-chan messages.EnvoyState, answers chan bool) {
	var envoy messages.EnvoyState
	select {
	case <-ctx.Done():
		return
	case envoy = <-states:
	}
	var (
		set    = relayed{epoch: -1}
		retry  <-chan time.Time
		wait   = relayRetryFirst
		warned bool
	)
	agent, _, changed := s.agentReady.Watch()
	answerer := &probeAnswerer{s: s, out: answers}
	defer answerer.set(false)
	for {
		if envoy.Epoch != set.epoch {
			set = relayed{epoch: envoy.Epoch} // a new process: the key is absent
		}
		want := agent.Ready && envoy.Phase == messages.EnvoyReady
		// An Envoy that has exited has nothing to be told.
		if envoy.Phase.Alive() && want != set.ready && retry == nil {
			if err := s.admin.setReadiness(ctx, want); err != nil {
				if ctx.Err() != nil {
					return
				}
				if !warned {
					s.log.Warn("cannot tell envoy the agent's readiness; the kubelet's probes go to the agent meanwhile",
						"ready", want, "retry_in", wait, "error", err)
					warned = true
				}
				retry, wait = s.clock.After(wait), min(2*wait, relayRetryMax)
			} else {
				set.ready, wait, warned = want, relayRetryFirst, false
			}
		}
		// The serving Envoy answers a probe itself while it lives and holds 100.
		answerer.set(set.ready && envoy.Phase.Alive())
		select {
		case <-ctx.Done():
			return
		case <-changed:
			agent, _, changed = s.agentReady.Watch()
			retry = nil
		case envoy = <-states:
			retry = nil
		case <-retry:
			retry = nil
		}
	}
}

// probeAnswerer reports who answers the kubelet's readiness probe: Envoy
// itself, or the agent behind it. The gauge, a log line at each change,
// and the envoy line of /debug/tree (through out, to the run) tell an
// operator which of the two a probe's answer came from. The relay's
// goroutine owns it, and sets it from what it last set in the serving
// Envoy; the gauge is 0 between relays.
type probeAnswerer struct {
	s     *Service
	out   chan bool
	envoy bool
}

func (a *probeAnswerer) set(envoy bool) {
	if envoy == a.envoy {
		return
	}
	a.envoy = envoy
	sendLatest(a.out, envoy)
	if envoy {
		a.s.envoyAnswersProbe.Set(1)
		a.s.log.Info("envoy answers the kubelet's readiness probe itself while the agent is ready", "key", bootstrap.ReadinessKey)
		return
	}
	a.s.envoyAnswersProbe.Set(0)
	a.s.log.Info("the kubelet's readiness probe goes through envoy to the agent again", "key", bootstrap.ReadinessKey)
}

// setReadiness sets bootstrap.ReadinessKey in the admin layer of Envoy's
// runtime: 100 when ready, 0 when not.
func (a *adminClient) setReadiness(ctx context.Context, ready bool) error {
	value := "0"
	if ready {
		value = "100"
	}
	return a.post(ctx, "/runtime_modify?"+bootstrap.ReadinessKey+"="+value)
}
