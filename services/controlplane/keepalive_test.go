package controlplane

import (
	"os"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/meshagent/meshagent/messages"
)

// TestSoakStreamOutlivesKeepalivePings: the agent's upstream connection
// pings every 30 s (GRPC_KEEPALIVE_INTERVAL's default). A server that keeps
// grpc-go's default enforcement (one ping per 5 minutes) answers the third
// with GOAWAY "too_many_pings" and the stream ends after about 2 minutes;
// istiod, and so this control plane, accept a ping every 15 s. It waits
// 150 s, so it runs only with MESHAGENT_SOAK=1 (make soak).
func TestSoakStreamOutlivesKeepalivePings(t *testing.T) {
	if os.Getenv("MESHAGENT_SOAK") == "" {
		t.Skip("a 150 s soak: set MESHAGENT_SOAK=1 (make soak)")
	}
	s := startServer(t, readSample(t), messages.Ready, nil)
	conn := s.dial(t, grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}))
	c := openSotW(t, conn)
	c.fetch(t, resource.ClusterType, nil)
	c.resps.Quiet(t, "an idle mesh with keepalive pings every 30 s", 150*time.Second)
}
