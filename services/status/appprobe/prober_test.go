package appprobe

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// The prober alone, for a context that is already over: no probe is sent.
func TestProbeHonoursCancelledContext(t *testing.T) {
	p := New(Config{}, slog.New(slog.DiscardHandler))
	defer p.client.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if res := p.tcp(ctx, "127.0.0.1:"+strconv.Itoa(testkit.FreePort(t))); res.healthy() || res.code != 500 {
		t.Fatalf("tcp probe with a cancelled context = %+v", res)
	}
}
