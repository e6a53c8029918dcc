package xdsproxy

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// The benchmarks compare, in the same run, a client connected to the
// control plane directly with one connected through the proxy, each on a
// snapshot of its own (a push reaches one of them at a time), rounds
// interleaved. Both clients decode every resource, as Envoy does. Run:
//
//	go test -run '^$' -bench . -benchtime 15x ./services/xdsproxy
//
// (make bench-xds; bench/xds/run.sh adds Istio's pilot-agent and each
// proxy's peak RSS, measured as separate processes.)

type benchPair struct {
	cp          *xdsserver.Server
	direct, via *xdsserver.Client
	stop        func()
}

// pushBoth pushes clusters as version v to both clients and returns how
// long each took to hold them. Which goes first alternates with round, so
// that neither always runs right after the other's garbage.
func (p *benchPair) pushBoth(ctx context.Context, b *testing.B, round int, v string, clusters []types.Resource) (direct, via time.Duration) {
	b.Helper()
	for _, viaFirst := range []bool{round%2 == 0, round%2 != 0} {
		c, node, out := p.direct, "direct", &direct
		if viaFirst {
			c, node, out = p.via, "via", &via
		}
		d, err := xdsserver.Push(ctx, p.cp, c, node, v, clusters)
		if err != nil {
			b.Fatal(err)
		}
		*out = d
	}
	return direct, via
}

func newBenchPair(b *testing.B, delta bool) *benchPair {
	b.Helper()
	cp, err := xdsserver.Start(xdsserver.Options{ByNode: true})
	if err != nil {
		b.Fatal(err)
	}
	root := tempRoot(b)
	cfg := testConfig(root, cp.Addr())
	cfg.NodeID = "via"
	cfg.CacheFile = filepath.Join(root, "xds-cache.pb")
	state := messages.NewCell[messages.XDSState]()
	svc, err := New(cfg, Inputs{}, Outputs{State: state}, messages.NewRuntime(Name, messages.Discard[messages.Health]{}, nil, nil, slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx) }()
	// The socket listens once the first state is out; a client that dialled
	// before would wait out gRPC's reconnect backoff.
	for {
		_, ok, changed := state.Watch()
		if ok {
			break
		}
		select {
		case <-changed:
		case err := <-done:
			b.Fatal(err)
		}
	}
	client := func(target, node string) *xdsserver.Client {
		c, err := xdsserver.NewClient(xdsserver.ClientOptions{
			Target: target, Delta: delta, Node: &corev3.Node{Id: node}, Types: []string{resource.ClusterType}, Reconnect: true,
		})
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	p := &benchPair{cp: cp, direct: client(cp.Addr(), "direct"), via: client("unix://"+cfg.SocketPath, "via")}
	p.stop = func() {
		p.direct.Close()
		p.via.Close()
		cancel()
		<-done
		cp.Close()
	}
	return p
}

// BenchmarkCDSPush: time until a client holds every cluster of a push,
// direct and via the proxy; via/direct is the figure (target ≤ 1.05).
func BenchmarkCDSPush(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		for _, delta := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/%d", protocolName(delta), n), func(b *testing.B) {
				p := newBenchPair(b, delta)
				defer p.stop()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				defer cancel()
				// Warm up: the first push of each client.
				for _, c := range []struct {
					node   string
					client *xdsserver.Client
				}{{"direct", p.direct}, {"via", p.via}} {
					if _, err := xdsserver.Push(ctx, p.cp, c.client, c.node, "warm", xdsserver.RoundClusters(n, 0)); err != nil {
						b.Fatal(err)
					}
				}
				var direct, via []time.Duration
				b.ResetTimer()
				for i := 1; i <= b.N; i++ {
					b.StopTimer()
					clusters := xdsserver.RoundClusters(n, i)
					b.StartTimer()
					v := fmt.Sprintf("r%d", i)
					d, vd := p.pushBoth(ctx, b, i, v, clusters)
					direct, via = append(direct, d), append(via, vd)
				}
				b.StopTimer()
				md, mv := xdsserver.Quantile(direct, 0.5), xdsserver.Quantile(via, 0.5)
				b.ReportMetric(float64(md.Microseconds())/1000, "direct-ms")
				b.ReportMetric(float64(mv.Microseconds())/1000, "via-ms")
				b.ReportMetric(float64(mv)/float64(md), "via/direct")
			})
		}
	}
}

// BenchmarkSmallUpdate: the latency a push of one changed cluster takes,
// direct and via the proxy; added p50 and p99 are the figures (target:
// ≤ 0.3 ms at p50).
func BenchmarkSmallUpdate(b *testing.B) {
	for _, delta := range []bool{false, true} {
		b.Run(protocolName(delta), func(b *testing.B) {
			p := newBenchPair(b, delta)
			defer p.stop()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			var direct, via []time.Duration
			for i := 0; i < b.N; i++ {
				clusters := xdsserver.RoundClusters(1, i)
				v := fmt.Sprintf("s%d", i)
				d, vd := p.pushBoth(ctx, b, i, v, clusters)
				direct, via = append(direct, d), append(via, vd)
			}
			us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
			b.ReportMetric(us(xdsserver.Quantile(direct, 0.5)), "direct-p50-µs")
			b.ReportMetric(us(xdsserver.Quantile(via, 0.5)), "via-p50-µs")
			b.ReportMetric(us(xdsserver.Quantile(via, 0.5)-xdsserver.Quantile(direct, 0.5)), "added-p50-µs")
			b.ReportMetric(us(xdsserver.Quantile(via, 0.99)-xdsserver.Quantile(direct, 0.99)), "added-p99-µs")
		})
	}
}
