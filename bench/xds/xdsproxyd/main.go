// Command xdsproxyd runs meshagent's XDS proxy alone, for the whole-process
// benchmark (make bench-xds): its peak RSS is compared with Istio's
// pilot-agent's, which needs the proxy in a process of its own. It calls
// xdsproxy.New itself, outside the tree, on purpose: a process holding only
// the proxy shows what the proxy itself costs (the agent's tree runs it
// beside every other service; bench/agent/rss.sh measures the whole agent).
//
// It prints "listening <socket>" on stdout once the socket accepts Envoy,
// and stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/bench/internal/benchmain"
	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/xdsproxy"
)

func main() {
	cfg := xdsproxy.NewConfig("")
	flag.StringVar(&cfg.SocketPath, "socket", "", "the XDS socket to listen on (absolute)")
	flag.StringVar(&cfg.DiscoveryAddress, "upstream", "", "the control plane, host:port (plaintext)")
	flag.StringVar(&cfg.NodeID, "node", "", "the node id whose configuration is cached")
	flag.StringVar(&cfg.CacheFile, "cache-file", "", "the cache file (empty: in memory only)")
	flag.BoolVar(&cfg.OfflineCache, "offline-cache", true, "keep and serve the last-known-good configuration")
	bench := benchmain.Define("xdsproxyd", slog.LevelWarn)
	flag.Parse()
	if cfg.SocketPath == "" || cfg.DiscoveryAddress == "" {
		fmt.Fprintln(os.Stderr, "xdsproxyd: -socket and -upstream are required")
		os.Exit(2)
	}
	if cfg.NodeID == "" {
		cfg.OfflineCache = false
	}
	cfg.Plaintext = true
	log := bench.Logger()
	bench.Run(log, func(ctx context.Context) error { return run(ctx, cfg, log) })
}

// announce prints "listening" at the first state the proxy publishes,
// which it does once its socket accepts.
type announce struct {
	socket string
	done   bool
}

func (a *announce) Send(messages.XDSState) {
	if !a.done {
		a.done = true
		fmt.Printf("listening %s\n", a.socket)
	}
}

func run(ctx context.Context, cfg xdsproxy.Config, log *slog.Logger) error {
	rt := messages.NewRuntime(xdsproxy.Name, messages.Discard[messages.Health]{}, nil, prometheus.NewRegistry(), log)
	svc, err := xdsproxy.New(cfg, xdsproxy.Inputs{}, xdsproxy.Outputs{State: &announce{socket: cfg.SocketPath}}, rt)
	if err != nil {
		return err
	}
	return svc.Serve(ctx)
}
