package tree

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// TestChaosSoak kills random services (leaves and whole subtrees) over and
// over through /debug/chaos/kill and checks that the tree always heals:
// readiness returns to 200 after every round and every kill is counted.
// `make chaos` runs the long form (MESHAGENT_CHAOS_LONG=1).
func TestChaosSoak(t *testing.T) {
	rounds := testkit.ChaosRounds(20, 500, 5)
	ch := NewChannels(nil)
	leaves := map[string]*readyService{}
	for _, name := range []string{"certs", "sds", "dns", "envoyish", "capture"} {
		leaves[name] = &readyService{name: name, health: ch.Health}
	}
	nodes := []Node{
		{Name: "capture", Service: leaves["capture"]},
		{Name: "identity", Children: []Node{{Name: "certs", Service: leaves["certs"]}, {Name: "sds", Service: leaves["sds"]}}},
		{Name: "names", Children: []Node{{Name: "dns", Service: leaves["dns"]}}},
		{Name: "envoyish", Service: leaves["envoyish"]},
	}
	required := []string{"certs", "sds", "dns", "envoyish", "capture"}
	h := newHarnessWith(t, ch, nodes, Options{}, required)
	h.waitStatus("/healthz/ready", 200)

	targets := []string{"certs", "sds", "dns", "envoyish", "capture", "identity", "names"}
	killed := map[string]int{}
	rng := rand.New(rand.NewPCG(42, uint64(time.Now().UnixNano())))
	deadline := time.Now().Add(5 * time.Minute)
	for round := 0; round < rounds && time.Now().Before(deadline); round++ {
		h.waitAllRunning()
		victim := targets[rng.IntN(len(targets))]
		if code, body := h.post("/debug/chaos/kill?service=" + victim); code != 200 {
			t.Fatalf("round %d: kill %s = %d %s", round, victim, code, body)
		}
		killed[victim]++
		testkit.WaitFor(t, fmt.Sprintf("round %d: %s restarted (%d kills)", round, victim, killed[victim]), func() bool {
			return h.counter("meshagent_service_restarts_total", victim) == float64(killed[victim])
		})
		h.waitStatus("/healthz/ready", 200)
	}
	for name, n := range killed {
		if got := h.counter("meshagent_service_restarts_total", name); got != float64(n) {
			t.Errorf("%s: %v restarts counted, %d kills", name, got, n)
		}
	}
	t.Logf("chaos: %d rounds, kills per service: %v", rounds, killed)
}

// killOnStarting is the tree's /debug/tree channel with a chaos request
// arriving the moment the tree first shows the service starting: status
// accepts a kill then, so the run must end.
type killOnStarting struct {
	runner *runner
	armed  atomic.Bool
}

func (k *killOnStarting) Send(s messages.TreeState) {
	for _, n := range s.Services {
		if n.State == messages.Starting && k.armed.CompareAndSwap(true, false) {
			k.runner.kill(0)
		}
	}
}

// A kill that status accepted because the tree showed the service
// starting lands on that run: the runner knows how to end the run before
// it tells the tree it is starting (it used to be the other way round, and
// such a kill was dropped).
func TestChaosKillWhileStartingLands(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry(), func() uint64 { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	hook := &killOnStarting{}
	clock := messages.SystemClock{}
	env := &runtimeEnv{clock: clock, registry: newRegistry(hook, clock), metrics: m, log: testkit.TestLogger(t),
		giveUp: func(*GiveUpError) {}}
	ch := NewChannels(nil)
	svc := &readyService{name: "dns", health: ch.Health}
	r := newRunner("dns", "dns", svc, *fastPolicy(), messages.NewReporter("dns", ch.Health, clock), env)
	hook.runner = r
	env.registry.add("dns", "dns", "service")
	hook.armed.Store(true)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrChaosKill) {
			t.Fatalf("Serve = %v, want the chaos kill", err)
		}
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatal("the kill accepted while the service was starting was lost: the run never ended")
	}
}
