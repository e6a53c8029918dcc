package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/services/memlimit"
	"github.com/meshagent/meshagent/tree"
)

func newProxyCommand(cli *cliContext, logs *logOptions) *cobra.Command {
	f := &config.ProxyFlags{}
	cmd := &cobra.Command{
		Use:   "proxy [sidecar|router|waypoint]",
		Short: "Runs the sidecar agent: the supervision tree around Envoy",
		// Istio's pilot-agent tolerates unknown flags on proxy (and root):
		// Istio-generated command lines carry flags of other versions.
		// They are named in a warning, never silently dropped.
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
	}
	s := config.NewSettings(cmd.Flags())
	config.BindProxyFlags(s, f)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		log, err := newLogger(*logs, cmd.ErrOrStderr())
		if err != nil { // reported with the other bad values below
			log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
		}
		if unknown := unknownFlags(cmd.Flags(), cli.args); len(unknown) > 0 {
			log.Warn("ignoring unknown flags, as Istio's pilot-agent does", "flags", unknown)
		}
		_ = s.Resolve(cli.host.Env) // bad values stay in s.problems, reported with the rest
		reg := prometheus.NewRegistry()
		plan, err := config.Build(config.Inputs{
			Flags: f, Args: args, LogLevel: logs.outputLevel, LogAsJSON: logs.asJSON, Version: currentVersion().Version, Host: cli.host, Problems: s.Problems, Log: log,
		})
		if err != nil {
			return &exitError{code: 2, err: err}
		}
		defer plan.Release()
		if plan.Tree.Certs != nil {
			plan.Tree.Certs.EarlyKey = cli.workloadKey
		}
		return cli.start(plan, reg, log)
	}
	return cmd
}

// start builds the tree of the agent a command configured, and runs it.
func (cli *cliContext) start(plan *config.Plan, reg *prometheus.Registry, log *slog.Logger) error {
	gc := &startupHold{log: log}
	agent, ch, err := buildTree(plan, reg, log, func() { gc.release("ready") })
	if err != nil {
		return err
	}
	if cli.startAgent != nil {
		return cli.startAgent(plan)
	}
	return runAgent(plan, agent, ch, reg, gc, log)
}

// buildTree builds the agent's tree from its configuration. The services'
// configs are checked here, once, by their New (#26: cmd checked them
// while building the configuration and New again): a bad one is a usage
// error like any bad value, and names its variable.
func buildTree(plan *config.Plan, reg *prometheus.Registry, log *slog.Logger, onFirstReady func()) (*tree.Agent, *tree.Channels, error) {
	agent, ch, err := tree.Build(plan.Tree, log, tree.Process{
		Clock:    messages.SystemClock{},
		Metrics:  reg,
		Notifier: tree.SystemdNotifier{},
		// The process is this agent's: give back what start-up held.
		OnFirstReady: onFirstReady,
	})
	if err != nil {
		return nil, nil, &exitError{code: 2, err: err}
	}
	return agent, ch, nil
}

// runAgent runs the built tree until a signal, /quitquitquit or a give-up.
// SIGTERM/SIGINT drain gracefully; a second signal stops at once; a third
// exits on the spot. SIGHUP is logged and ignored (hupNote).
func runAgent(plan *config.Plan, agent *tree.Agent, ch *tree.Channels, reg *prometheus.Registry, gc *startupHold, log *slog.Logger) error {
	if err := checkPorts(listenPorts(plan)); err != nil {
		return &exitError{code: 2, err: err}
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	memlimit.Apply(plan.MemoryLimitRatio, "", log) // Istio's automemlimit rule (#36)
	gc.hold(plan.GCPercent, plan.IdleMaxProcs)
	log.Info("meshagent starting", append([]any{"version", currentVersion().Version, "envoy", describeEnvoy(plan.Proxy.BinaryPath)}, plan.Essentials()...)...)
	config.LogEffective(log, plan)

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
	err := agent.Run(context.Background())
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
