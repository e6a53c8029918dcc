package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/tree"
)

// proxyFlags are the `proxy` command's flags: Istio's pilot-agent flags
// plus meshagent's own. A pointer stays nil when the flag was not given,
// where that differs from any value.
type proxyFlags struct {
	// Istio's
	domain                                string
	meshConfig                            *string // nil: Istio's default path, which may be missing; given, it must exist
	serviceCluster                        *string // wins over ProxyConfig's when given
	proxyLogLevel, proxyComponentLogLevel string
	templateFile, outlierLogPath          string
	tokenManagerPlugin                    string
	stsPort                               int
	concurrency                           *int // legacy: overrides ProxyConfig.concurrency when given and not 0
	profiling                             bool
	// meshagent's
	root               string
	chaos              bool
	capture            bool
	captureInterval    time.Duration
	nameTable          string
	resolvConf         string
	envoyRestarts      int
	envoyRestartWindow time.Duration
	hotRestart         bool
	restartMaxDelay    time.Duration
}

func bindProxyFlags(s *settings, f *proxyFlags) {
	str := func(p *string, name, def, usage string, env ...string) {
		flagVar(s, p, def, config.ParseString, flagSpec{name: name, env: env, usage: usage})
	}
	str(&f.domain, "domain", "", "DNS domain suffix. If not provided uses ${POD_NAMESPACE}.svc.cluster.local")
	optionalFlagVar(s, &f.meshConfig, config.ParseString, flagSpec{name: "meshConfig",
		usage: "File name for Istio mesh configuration (under --root; default " + meshConfigFile + "). If not specified and the default file does not exist, a default mesh will be used; a file named here must exist"})
	optionalFlagVar(s, &f.serviceCluster, config.ParseString, flagSpec{name: "serviceCluster", usage: "Service cluster (default istio-proxy; given, it wins over ProxyConfig's)"})
	str(&f.proxyLogLevel, "proxyLogLevel", "warning", "The log level used to start the Envoy proxy (choose from {trace, debug, info, warning, error, critical, off}). Level may also include one or more scopes, such as 'info,misc:error,upstream:debug'")
	str(&f.proxyComponentLogLevel, "proxyComponentLogLevel", "", "The component log level used to start the Envoy proxy. Deprecated, use proxyLogLevel instead")
	str(&f.templateFile, "templateFile", "", "Go template bootstrap config")
	str(&f.outlierLogPath, "outlierLogPath", "", "The log path for outlier detection")
	str(&f.tokenManagerPlugin, "tokenManagerPlugin", "GoogleTokenExchange", "Token provider specific plugin name (accepted for compatibility; meshagent has no STS server)")
	flagVar(s, &f.stsPort, 0, config.ParseCount, flagSpec{name: "stsPort", usage: "HTTP Port on which to serve Security Token Service (STS). If zero, STS service will not be provided (meshagent: only 0 is supported)"})
	optionalFlagVar(s, &f.concurrency, config.ParseCount, flagSpec{name: "concurrency", usage: "number of worker threads to run (legacy: prefer ProxyConfig.concurrency; 0 or unset leaves it alone)"})
	flagVar(s, &f.profiling, true, config.ParseBool, flagSpec{name: "profiling", usage: "Enable profiling via web interface host:port/debug/pprof/ (loopback callers only)"})

	str(&f.root, "root", "/", "Directory under which every agent file path lives; / in production, a temp dir in tests", "MESHAGENT_ROOT")
	str(&f.nameTable, "name-table", "", "Serve DNS from this name table file (protojson of Istio's NDS NameTable), reloaded when it changes; turns the DNS proxy on")
	str(&f.resolvConf, "resolv-conf", resolvConfFile, "resolv.conf whose nameservers the DNS proxy forwards to and whose search list it uses")
	flagVar(s, &f.capture, false, config.ParseBool, flagSpec{name: "capture", env: []string{"MESHAGENT_CAPTURE"},
		usage: "VM mode: apply the iptables capture rules from the ISTIO_* environment at start, re-apply them if flushed, remove them on stop; without it the agent only verifies rules an init container applied"})
	flagVar(s, &f.captureInterval, 30*time.Second, config.ParseDuration, flagSpec{name: "capture-check-interval", env: []string{"MESHAGENT_CAPTURE_CHECK_INTERVAL"},
		usage: "VM mode: how often the capture rules are checked and re-applied if someone flushed or changed them"})
	flagVar(s, &f.chaos, false, config.ParseBool, flagSpec{name: "chaos", env: []string{"MESHAGENT_CHAOS"}, usage: "Enable POST /debug/chaos/kill?service=NAME on the status port, loopback only"})
	flagVar(s, &f.envoyRestarts, 5, config.ParseCount, flagSpec{name: "envoy-restarts", usage: "Restarts of a failed Envoy allowed within --envoy-restart-window before the agent exits; 0 exits when Envoy exits, as Istio's agent does"})
	flagVar(s, &f.envoyRestartWindow, 5*time.Minute, config.ParseDuration, flagSpec{name: "envoy-restart-window", usage: "Window for --envoy-restarts"})
	flagVar(s, &f.hotRestart, false, config.ParseBool, flagSpec{name: "hot-restart", env: []string{"MESHAGENT_HOT_RESTART"},
		usage: "Apply a change of Envoy's bootstrap (mesh config file, ProxyConfig annotation, template) or of its binary by an Envoy hot restart, without refusing a connection; off: Istio's --disable-hot-restart"})
	flagVar(s, &f.restartMaxDelay, 30*time.Second, config.ParseDuration, flagSpec{name: "restart-max-delay", usage: "Cap of the growing delay before a failed service is restarted (the first failure after a healthy run restarts at once)"})
}

func newProxyCommand(cli *cliContext, logs *logOptions) *cobra.Command {
	f := &proxyFlags{}
	cmd := &cobra.Command{
		Use:   "proxy [sidecar|router|waypoint]",
		Short: "Runs the sidecar agent: the supervision tree around Envoy",
		// Istio's pilot-agent tolerates unknown flags on proxy (and root):
		// Istio-generated command lines carry flags of other versions.
		// They are named in a warning, never silently dropped.
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
	}
	s := newSettings(cmd.Flags())
	bindProxyFlags(s, f)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		log, err := newLogger(*logs, cmd.ErrOrStderr())
		if err != nil { // reported with the other bad values below
			log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
		}
		if unknown := unknownFlags(cmd.Flags(), cli.args); len(unknown) > 0 {
			log.Warn("ignoring unknown flags, as Istio's pilot-agent does", "flags", unknown)
		}
		_ = s.resolve(cli.host.env) // bad values stay in s.problems, reported with the rest
		reg := prometheus.NewRegistry()
		cfg, err := buildAgentConfig(agentInputs{
			flags: f, args: args, logs: *logs, host: cli.host, gatherer: reg, problems: s.problems, log: log,
		})
		if err != nil {
			return &exitError{code: 2, err: err}
		}
		defer cfg.release()
		return runAgent(cfg, reg, log)
	}
	return cmd
}

// runAgent builds the tree and runs it until a signal, /quitquitquit or a
// give-up. SIGTERM/SIGINT drain gracefully; a second signal stops at once;
// a third exits on the spot. SIGHUP is logged and ignored (hupNote).
func runAgent(cfg *agentConfig, reg *prometheus.Registry, log *slog.Logger) error {
	if err := checkPorts(listenPorts(cfg)); err != nil {
		return &exitError{code: 2, err: err}
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	setSidecarGC(cfg.gogc, log)
	agent, ch, err := tree.Build(cfg.tree, reg, log, tree.Process{
		Notifier: tree.SystemdNotifier{},
		// The process is this agent's: give back what start-up held.
		OnFirstReady: func() { releaseStartupMemory(log) },
	})
	if err != nil {
		return err
	}
	log.Info("meshagent starting", "version", currentVersion().Version, "type", cfg.proxyType, "root", cfg.root,
		"envoy", describeEnvoy(cfg.proxy.BinaryPath))
	logEffectiveConfig(log, cfg)

	sigs := make(chan os.Signal, 3)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	defer signal.Stop(hups)
	stopSignals := make(chan struct{})
	signalsDone := make(chan struct{})
	go func() {
		defer close(signalsDone)
		n := 0
		for {
			select {
			case <-hups:
				log.Info("SIGHUP: nothing to reload; ignored", "why", hupNote)
			case sig := <-sigs:
				n++
				switch n {
				case 1:
					log.Info("signal received, draining", "signal", sig.String())
					ch.Shutdown.Send(shutdownFor(sig, true))
				case 2:
					log.Warn("second signal received, stopping now", "signal", sig.String())
					ch.Shutdown.Send(shutdownFor(sig, false))
				default:
					log.Error("third signal received, exiting at once", "signal", sig.String())
					os.Exit(1)
				}
			case <-stopSignals:
				return
			}
		}
	}()
	err = agent.Run(context.Background())
	close(stopSignals)
	<-signalsDone

	var gu *tree.GiveUpError
	if errors.As(err, &gu) {
		return &exitError{code: giveUpExitCode(gu), err: err}
	}
	if err == nil {
		log.Info("meshagent stopped")
	}
	return err
}

// hupNote is why SIGHUP (systemd's `reload`) reloads nothing (#21): it
// used to kill the agent at once, Envoy's connections with it. What the
// agent reads while it runs is already watched and reloaded when it
// changes (certificates, the CRL, --name-table, standalone's --mesh); the
// rest (flags, the environment, the mesh config, annotations) shapes Envoy's
// bootstrap, and applying it would mean a new Envoy, dropping the very
// connections a reload must keep. A restart applies those.
const hupNote = "watched files (certificates, CRL, name table) reload when they change; flags, environment and mesh config need a restart"

func shutdownFor(sig os.Signal, graceful bool) messages.Shutdown {
	return messages.Shutdown{Reason: "received " + sig.String(), Graceful: graceful}
}

// giveUpExitCode is the agent's exit code when a service gave up: the
// exit status of Envoy when it was the first and only failure
// (--envoy-restarts=0, Istio's behaviour), else 1.
func giveUpExitCode(gu *tree.GiveUpError) int {
	var exited *envoy.ExitError
	if gu.Failures == 1 && errors.As(gu.Err, &exited) && exited.ExitCode > 0 {
		return exited.ExitCode
	}
	return 1
}
