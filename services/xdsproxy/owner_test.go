package xdsproxy

import (
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// Everything posted before stop is applied, in order, the backlog
// included; after stop (a gRPC handler may outlive Serve) a message
// neither blocks nor runs.
func TestOwnerAppliesEveryMessageThenRefuses(t *testing.T) {
	o := newOwner(&proxyState{}, testkit.NewManualClock())
	go o.run()
	var got []int
	for i := range 3 * ownerBacklog {
		o.post(func(*proxyState) { got = append(got, i) })
	}
	o.stop()
	if len(got) != 3*ownerBacklog {
		t.Fatalf("%d messages applied, want %d", len(got), 3*ownerBacklog)
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("message %d applied as the %dth: out of order", v, i)
		}
	}
	o.post(func(*proxyState) { t.Error("a message ran after stop") })
	if o.ask(func(*proxyState) { t.Error("a question ran after stop") }) {
		t.Error("ask said it ran after stop")
	}
}
