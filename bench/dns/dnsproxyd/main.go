// Command dnsproxyd runs meshagent's DNS proxy standalone, with its name
// table read from a file, for benchmarks (make bench-dns).
//
// It calls dnsproxy.New and nametable.New itself, outside tree/, on
// purpose (docs/architecture.md lists the four such calls): a benchmark
// main isolates one service for measurement. Under tree the proxy would share the process with the
// status server, SDS, Envoy's bootstrap and their memory and goroutines, so
// its RSS and CPU figures beside CoreDNS and dnsmasq would no longer be the
// proxy's own (bench/agent/rss.sh measures the whole agent). It gets no
// supervision, restarts or readiness: a failure ends the run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/bench/internal/benchmain"
	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/dnsproxy"
	"github.com/meshagent/meshagent/services/nametable"
)

func main() {
	var cfg dnsproxy.Config
	table := flag.String("table", "", "name table file (protojson istio.networking.nds.v1.NameTable)")
	flag.StringVar(&cfg.Listen, "listen", "localhost:15053", "listen address (loopback only)")
	flag.StringVar(&cfg.ResolvConf, "resolv-conf", "/etc/resolv.conf", "resolv.conf with the upstream nameservers")
	flag.StringVar(&cfg.Namespace, "namespace", "default", "the proxy's namespace")
	flag.StringVar(&cfg.Domain, "domain", "", "the proxy's domain (default <namespace>.svc.cluster.local)")
	flag.DurationVar(&cfg.ForwardTimeout, "forward-timeout", 5*time.Second, "upstream timeout")
	flag.BoolVar(&cfg.ForwardParallel, "forward-parallel", false, "query all upstreams at once")
	bench := benchmain.Define("dnsproxyd", slog.LevelInfo)
	flag.Parse()
	if *table == "" {
		fmt.Fprintln(os.Stderr, "dnsproxyd: -table is required")
		os.Exit(2)
	}
	log := bench.Logger()
	bench.Run(log, func(ctx context.Context) error { return run(ctx, cfg, *table, log) })
}

// healthLog logs every health change.
type healthLog struct{ log *slog.Logger }

func (h healthLog) Send(v messages.Health) {
	h.log.Info("health", "service", v.Service, "state", v.State.String(), "reason", v.Reason)
}

func run(ctx context.Context, cfg dnsproxy.Config, tablePath string, log *slog.Logger) error {
	cell := messages.NewCell[messages.NameTable]()
	health := healthLog{log}
	svc, err := dnsproxy.New(cfg, dnsproxy.Inputs{Table: cell}, dnsproxy.Outputs{}, messages.NewRuntime(dnsproxy.Name, health, nil, prometheus.NewRegistry(), log))
	if err != nil {
		return err
	}
	tf, err := nametable.New(nametable.Config{File: tablePath}, nametable.Inputs{}, nametable.Outputs{Table: cell},
		messages.NewRuntime(nametable.Name, health, nil, nil, log))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for _, s := range []interface{ Serve(context.Context) error }{tf, svc} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.Serve(ctx)
		}()
	}
	err = <-errs
	cancel()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		return errors.New("shutdown timed out")
	}
	return err
}
