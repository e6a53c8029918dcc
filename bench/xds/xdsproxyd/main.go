// Command xdsproxyd runs meshagent's XDS proxy alone, for the whole-process
// benchmark (make bench-xds): its peak RSS is compared with Istio's
// pilot-agent's, which needs the proxy in a process of its own. It calls
// xdsproxy.New directly because the agent's tree and CLI do not wire the
// service in yet, and because a process holding only the proxy shows what
// the proxy itself costs.
//
// It prints "listening <socket>" on stdout once the socket accepts Envoy,
// and stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

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
	verbose := flag.Bool("v", false, "debug logs")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memProfile := flag.String("memprofile", "", "write an allocation profile (pprof allocs) to this file at exit")
	flag.Parse()
	if cfg.SocketPath == "" || cfg.DiscoveryAddress == "" {
		fmt.Fprintln(os.Stderr, "xdsproxyd: -socket and -upstream are required")
		os.Exit(2)
	}
	if cfg.NodeID == "" {
		cfg.OfflineCache = false
	}
	cfg.Plaintext = true
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "xdsproxyd: -cpuprofile: %v\n", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	err := run(cfg, log)
	if *memProfile != "" {
		if f, perr := os.Create(*memProfile); perr == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Error("xdsproxyd failed", "error", err)
		os.Exit(1)
	}
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

type discard[T any] struct{}

func (discard[T]) Send(T) {}

func run(cfg xdsproxy.Config, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rt := messages.NewRuntime(xdsproxy.Name, discard[messages.Health]{}, nil, prometheus.NewRegistry(), log)
	svc, err := xdsproxy.New(cfg, xdsproxy.Inputs{}, xdsproxy.Outputs{State: &announce{socket: cfg.SocketPath}}, rt)
	if err != nil {
		return err
	}
	return svc.Serve(ctx)
}
