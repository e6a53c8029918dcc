package xdsproxy

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
)

// stubStream is a proxyStream that records its end; registering calls
// nothing else of it.
type stubStream struct {
	proxyStream
	ended bool
}

func (s *stubStream) end(error) { s.ended = true }

// During an Envoy hot restart (#25) the new epoch's stream replaces the
// old epoch's, and the old epoch, which reconnects, does not take it back:
// the two would replace each other until the old one exits. Once the new
// one's stream ends, any Envoy may register again.
func TestOldEpochDoesNotTakeTheStreamBack(t *testing.T) {
	svc, err := New(testConfig(tempRoot(t), "127.0.0.1:1"), Inputs{}, Outputs{State: &testkit.Recorder[messages.XDSState]{}},
		messages.NewRuntime(Name, &testkit.Recorder[messages.Health]{}, nil, nil, testkit.NewLogBuffer(t).Logger()))
	if err != nil {
		t.Fatal(err)
	}
	own := newOwner(svc.state, testkit.NewManualClock())
	go own.run()
	defer own.stop()
	oldEpoch, newEpoch := peerCred{pid: 100, uid: 1337}, peerCred{pid: 200, uid: 1337}
	first := &stubStream{}
	if err := own.register(first, oldEpoch); err != nil {
		t.Fatal(err)
	}
	second := &stubStream{}
	if err := own.register(second, newEpoch); err != nil || !first.ended {
		t.Fatalf("the new epoch's stream: %v, old one ended %v; want it to replace the old one", err, first.ended)
	}
	back := &stubStream{}
	if err := own.register(back, oldEpoch); status.Code(err) != codes.Unavailable || second.ended {
		t.Fatalf("the old epoch reconnecting: %v (new stream ended %v), want Unavailable and the new stream kept", err, second.ended)
	}
	// The same Envoy's own newer stream still replaces its stream.
	third := &stubStream{}
	if err := own.register(third, newEpoch); err != nil || !second.ended {
		t.Fatalf("the new epoch's newer stream: %v", err)
	}
	own.unregister(third)
	if err := own.register(&stubStream{}, oldEpoch); err != nil {
		t.Fatalf("after the stream ended, an Envoy of the old pid: %v", err)
	}
}
