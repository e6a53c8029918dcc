package tree

import (
	"sync"

	"github.com/meshagent/meshagent/messages"
)

// registry holds what /debug/tree shows. Each runner updates its own entry;
// every update publishes a fresh snapshot, so readers never lock.
type registry struct {
	mu    sync.Mutex
	order []string
	nodes map[string]*messages.ServiceInfo
	out   messages.Sink[messages.TreeState]
	clock messages.Clock
}

func newRegistry(out messages.Sink[messages.TreeState], clock messages.Clock) *registry {
	return &registry{nodes: map[string]*messages.ServiceInfo{}, out: out, clock: clock}
}

// add registers a node in depth-first order.
func (r *registry) add(path, name, kind string) {
	r.mu.Lock()
	r.order = append(r.order, path)
	r.nodes[path] = &messages.ServiceInfo{
		Name: name, Path: path, Kind: kind,
		State: messages.Starting, StateName: messages.Starting.String(), Since: r.clock.Now(),
	}
	r.publishLocked()
	r.mu.Unlock()
}

// update changes one node and publishes the tree.
func (r *registry) update(path string, change func(*messages.ServiceInfo)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[path]
	if !ok {
		return
	}
	before := n.State
	change(n)
	n.StateName = n.State.String()
	if n.State != before {
		n.Since = r.clock.Now()
	}
	r.publishLocked()
}

func (r *registry) publishLocked() {
	s := messages.TreeState{Services: make([]messages.ServiceInfo, 0, len(r.order))}
	for _, p := range r.order {
		s.Services = append(s.Services, *r.nodes[p])
	}
	r.out.Send(s)
}
