package xdsserver

import (
	"context"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The kit on its own: a client gets a snapshot in both protocols, the
// server counts its ACKs, a restart on the same address is followed, and
// a bad token is refused.
func TestServerAndClient(t *testing.T) {
	for _, delta := range []bool{false, true} {
		srv, err := Start(Options{})
		if err != nil {
			t.Fatal(err)
		}
		listeners := []types.Resource{Listener("l", "r", false, 80)}
		if err := srv.SetSnapshot("v1", Clusters(5, "c"), listeners, nil, nil, nil); err != nil {
			t.Fatal(err)
		}
		c, err := NewClient(ClientOptions{Target: srv.Addr(), Delta: delta, Reconnect: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		has := func(v string, n int) func(State) bool {
			return func(s State) bool {
				return s.Versions[resource.ClusterType] == v && s.Counts[resource.ClusterType] == n
			}
		}
		if err := c.WaitFor(ctx, has("v1", 5)); err != nil {
			t.Fatal(err)
		}
		if err := srv.WaitFor(ctx, func(s Stats) bool { return s.ACKs[resource.ClusterType] >= 1 }); err != nil {
			t.Fatal(err)
		}
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		if err := srv.SetSnapshot("v2", Clusters(3, "d"), listeners, nil, nil, nil); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitFor(ctx, has("v2", 3)); err != nil {
			t.Fatal(err)
		}
		if st := c.State(); st.Streams < 2 {
			t.Errorf("delta=%v: %d streams across a restart", delta, st.Streams)
		}
		c.Close()
		srv.Close()
		cancel()
	}

	srv, err := Start(Options{Token: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := NewClient(ClientOptions{Target: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitFor(ctx, func(s State) bool { return len(s.Ends) == 1 }); err != nil {
		t.Fatal(err)
	}
	if code := status.Code(c.State().Ends[0]); code != codes.Unauthenticated {
		t.Errorf("no token: %v, want Unauthenticated", code)
	}
	if srv.Stats().Rejected != 1 {
		t.Errorf("rejected %d streams, want 1", srv.Stats().Rejected)
	}
}
