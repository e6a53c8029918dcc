// Command fakeenvoy is a stand-in for Envoy in tests. It is a test tool, never
// the product.
//
// It accepts Envoy's command line (unknown flags exit 1, like Envoy), loads
// and validates the bootstrap, serves the admin API on the bootstrap's admin
// address, serves the bootstrap's static HTTP listeners by routing to its
// static clusters, connects to the xDS cluster and, for each secret its
// configuration names over SDS, to that secret's cluster over their unix
// sockets, ACKs what it receives, and exits 0 on SIGTERM.
//
// Its one data path (relay.go): on the capture listeners (Istio's
// virtualOutbound 15001 and virtualInbound 15006, static or from LDS) it
// relays captured TCP byte for byte to the original destination, as Envoy's
// passthrough clusters. It does no TLS, no filter chains, no routing to a
// service's endpoints, no load balancing: it carries a pod's plain TCP, and
// nothing an Envoy would decide about it.
//
// Where the agent relies on it, it behaves as Envoy does (init.go): with ADS
// it stays PRE_INITIALIZING until its clusters (with their endpoints and
// SDS secrets, sds.go) and listeners (with their routes and secrets) have
// arrived, asks for LDS only once the clusters are warm, counts xDS updates
// and rejections in its stats, NACKs a config that fails Envoy's
// validation, and redials a stream that ended with Envoy's backoff
// (backoff.go).
//
// Environment knobs (see knobs.go): FAKE_ENVOY_CRASH_AFTER,
// FAKE_ENVOY_EXIT_CODE, FAKE_ENVOY_NEVER_READY, FAKE_ENVOY_READY_AFTER,
// FAKE_ENVOY_IGNORE_SIGTERM, FAKE_ENVOY_ACTIVE_CONNECTIONS,
// FAKE_ENVOY_DRAIN_SECONDS, FAKE_ENVOY_REJECT, FAKE_ENVOY_REJECT_NAME,
// FAKE_ENVOY_EXIT_AT_START, FAKE_ENVOY_HOT_RESTART_RETRY_DELAY,
// FAKE_ENVOY_STATS_PEERS; and
// FAKE_ENVOY_RECORD, FAKE_ENVOY_RECORD_EXIT (record.go).
//
// Without --disable-hot-restart it restarts by epochs as Envoy does:
// hotrestart.go says what matches Envoy and what is simplified.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// options is Envoy's command line, as much as the agent uses.
type options struct {
	configPath, configYAML                    string
	drainTimeS                                int
	drainStrategy, localAddressIPVersion      string
	fileFlushIntervalMsec, fileFlushMinSizeKB int
	disableHotRestart, allowUnknownStatic     bool
	logLevel, componentLogLevel, logFormat    string
	concurrency                               int
	skipDeprecatedLogs, enableCoreDump        bool
	serviceCluster, serviceNode               string
	baseID, restartEpoch                      int
	// Hot restart (hotrestart.go, #25).
	parentShutdownTimeS      int
	mode                     string // serve or validate
	socketPath               string
	socketMode               uint32
	skipHotRestartOnNoParent bool
	hotRestartVersion        bool
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("envoy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, "usage: envoy -c <bootstrap> [options] (fakeenvoy: a test stand-in)") }
	fs.StringVar(&o.configPath, "c", "", "bootstrap file")
	fs.StringVar(&o.configPath, "config-path", "", "bootstrap file")
	fs.StringVar(&o.configYAML, "config-yaml", "", "bootstrap override, merged")
	fs.IntVar(&o.drainTimeS, "drain-time-s", 600, "drain time")
	fs.StringVar(&o.drainStrategy, "drain-strategy", "gradual", "gradual|immediate")
	fs.StringVar(&o.localAddressIPVersion, "local-address-ip-version", "v4", "v4|v6")
	fs.IntVar(&o.fileFlushIntervalMsec, "file-flush-interval-msec", 10000, "")
	fs.IntVar(&o.fileFlushMinSizeKB, "file-flush-min-size-kb", 64, "")
	fs.BoolVar(&o.disableHotRestart, "disable-hot-restart", false, "")
	fs.BoolVar(&o.allowUnknownStatic, "allow-unknown-static-fields", false, "")
	fs.StringVar(&o.logLevel, "l", "info", "log level")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level")
	fs.StringVar(&o.componentLogLevel, "component-log-level", "", "")
	fs.StringVar(&o.logFormat, "log-format", "", "")
	fs.IntVar(&o.concurrency, "concurrency", 0, "")
	fs.BoolVar(&o.skipDeprecatedLogs, "skip-deprecated-logs", false, "")
	fs.BoolVar(&o.enableCoreDump, "enable-core-dump", false, "")
	fs.StringVar(&o.serviceCluster, "service-cluster", "", "")
	fs.StringVar(&o.serviceNode, "service-node", "", "")
	fs.IntVar(&o.baseID, "base-id", 0, "")
	fs.IntVar(&o.restartEpoch, "restart-epoch", 0, "")
	fs.IntVar(&o.parentShutdownTimeS, "parent-shutdown-time-s", 900, "")
	fs.StringVar(&o.mode, "mode", "serve", "serve|validate")
	fs.StringVar(&o.socketPath, "socket-path", "@envoy_domain_socket", "hot restart socket path")
	socketMode := fs.String("socket-mode", "600", "hot restart socket file permission (octal)")
	fs.BoolVar(&o.skipHotRestartOnNoParent, "skip-hot-restart-on-no-parent", false, "")
	fs.BoolVar(&o.hotRestartVersion, "hot-restart-version", false, "")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch o.mode {
	case "serve", "validate":
	default:
		return nil, fmt.Errorf("error: unknown mode '%s'", o.mode)
	}
	if o.baseID < 0 || o.restartEpoch < 0 || o.baseID > 0x0FFFFFFF {
		return nil, fmt.Errorf("--base-id %d / --restart-epoch %d: want small non-negative numbers", o.baseID, o.restartEpoch)
	}
	// Envoy: an abstract socket has no mode.
	if o.socketPath == "" {
		return nil, fmt.Errorf("--socket-path: empty")
	}
	if o.socketPath[0] != '@' {
		m, err := strconv.ParseUint(*socketMode, 8, 32)
		if err != nil {
			return nil, fmt.Errorf("error: invalid socket-mode '%s'", *socketMode)
		}
		o.socketMode = uint32(m)
	}
	if o.hotRestartVersion {
		return o, nil
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	switch o.drainStrategy {
	case "gradual", "immediate":
	default:
		return nil, fmt.Errorf("--drain-strategy %q: want gradual or immediate", o.drainStrategy)
	}
	switch o.localAddressIPVersion {
	case "v4", "v6":
	default:
		return nil, fmt.Errorf("--local-address-ip-version %q: want v4 or v6", o.localAddressIPVersion)
	}
	if o.configPath == "" && o.configYAML == "" {
		return nil, fmt.Errorf("at least one of --config-path or --config-yaml must be given")
	}
	return o, nil
}

func main() {
	log.SetPrefix(fmt.Sprintf("fakeenvoy[%d] ", os.Getpid()))
	log.SetFlags(log.Lmicroseconds)
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if dir, exit, err := recordKnob(); err != nil {
		log.Printf("error: %v", err)
		return 1
	} else if dir != "" {
		// Before the command line is parsed: a line Envoy would refuse is
		// recorded too.
		if err := record(dir, args, configPathArg(args)); err != nil {
			log.Printf("error: %v", err)
			return 1
		}
		if exit >= 0 {
			return exit
		}
	}
	opts, err := parseFlags(args, os.Stderr)
	if err != nil {
		log.Printf("error: %v", err)
		return 1
	}
	if opts.hotRestartVersion {
		// Envoy prints it on stderr, without a newline, and exits 0.
		fmt.Fprint(os.Stderr, map[bool]string{true: "disabled", false: hotRestartVersion}[opts.disableHotRestart])
		return 0
	}
	k, err := readKnobs()
	if err != nil {
		log.Printf("error: %v", err)
		return 1
	}
	if opts.mode == "validate" {
		// Envoy's --mode validate binds nothing (no hot restart either).
		if _, err := loadBootstrap(opts); err != nil {
			log.Printf("error initializing configuration '%s': %v", opts.configPath, err)
			return 1
		}
		fmt.Printf("configuration '%s' OK\n", opts.configPath)
		return 0
	}
	// As Envoy: the hot restart sockets and shared memory are taken before
	// the bootstrap is read, so that a bootstrap that does not load leaves
	// this epoch's INITIALIZING flag set.
	var hr *hotRestart
	if !opts.disableHotRestart {
		if hr, err = newHotRestart(opts, k); err != nil {
			log.Printf("error: %v", err)
			return 1
		}
		defer hr.close()
	}
	if k.exitAtStart {
		log.Printf("exiting with code %d at start (FAKE_ENVOY_EXIT_AT_START)", k.exitCode)
		return k.exitCode
	}
	boot, err := loadBootstrap(opts)
	if err != nil {
		log.Printf("error initializing configuration '%s': %v", opts.configPath, err)
		return 1
	}

	// SIGTERM/SIGINT end the fake like Envoy: a short graceful close, exit 0.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newEnvoy(boot, k)
	e.opts = opts
	if hr != nil {
		// Envoy asks its parent to shut its admin down before binding its
		// own; the reply dates the first epoch.
		e.hr = hr
		first, err := hr.shutdownParentAdmin(opts.skipHotRestartOnNoParent)
		if err != nil {
			log.Printf("error: %v", err)
			return 1
		}
		if !first.IsZero() {
			e.firstStarted = first
		}
	}
	exit := make(chan int, 1)
	if err := e.start(ctx, exit); err != nil {
		log.Printf("error: %v", err)
		return 1
	}
	log.Printf("started: admin on %s", e.adminAddr)

	var crash <-chan time.Time
	if k.crashAfter > 0 {
		crash = time.After(k.crashAfter)
	}
	for {
		select {
		case s := <-sigs:
			if k.ignoreSIGTERM {
				log.Printf("ignoring %v (FAKE_ENVOY_IGNORE_SIGTERM)", s)
				continue
			}
			log.Printf("caught %v, shutting down", s)
			e.terminateParent()
			e.shutdown()
			return 0
		case <-crash:
			log.Printf("crashing with exit code %d (FAKE_ENVOY_CRASH_AFTER)", k.exitCode)
			return k.exitCode
		case code := <-exit:
			e.terminateParent()
			e.shutdown()
			return code
		}
	}
}

// configPathArg is the value of -c / --config-path in args, "" if none.
func configPathArg(args []string) string {
	for i, a := range args {
		for _, name := range []string{"-c", "--c", "-config-path", "--config-path"} {
			if a == name && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
	}
	return ""
}
