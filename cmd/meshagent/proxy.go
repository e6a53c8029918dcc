package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/capture"
	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/dnsproxy"
	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/services/sds"
	"github.com/meshagent/meshagent/services/status"
	"github.com/meshagent/meshagent/tree"
)

// proxyFlags are the `proxy` command's flags: Istio's pilot-agent flags
// plus meshagent's own (--root, --chaos, --envoy-restarts).
type proxyFlags struct {
	// Istio's
	domain, meshConfig, serviceCluster             string
	proxyLogLevel, proxyComponentLogLevel          string
	templateFile, outlierLogPath, tokenManagerPlug string
	stsPort, concurrency                           int
	profiling                                      bool
	// meshagent's
	root               string
	chaos              bool
	capture            bool
	nameTable          string
	resolvConf         string
	envoyRestarts      int
	envoyRestartWindow time.Duration
	restartMaxDelay    time.Duration
}

// agentConfig is the whole configuration of a `proxy` run, parsed once from
// flags, environment and files, and validated in one place.
type agentConfig struct {
	root      string
	proxyType string
	proxy     *meshconfig.ProxyConfig
	pod       podInfo
	domain    string
	chaos     bool
	profiling bool
	// Envoy's bootstrap and command line
	nodeIPs           []string
	serviceCluster    string
	templateFile      string
	logLevel          string
	componentLogLevel string
	logAsJSON         bool
	envoy             envoySettings
	// the DNS proxy
	dnsEnabled bool
	dnsAddr    string
	// the services' configs, built and validated by parseAgentConfig
	certs    *certs.Config
	sds      *sds.Config
	envoyCfg *envoy.Config
	// bootstrap is what envoyCfg's Prepare writes before every start.
	bootstrap envoy.BootstrapConfig
	capture   *capture.ServiceConfig
	dns       *dnsproxy.Config
	// nameTableFile feeds the DNS proxy from a file (--name-table).
	nameTableFile string
	// envoy restart limit: more than envoyRestarts failures within
	// envoyRestartWindow and the agent exits.
	envoyRestarts      int
	envoyRestartWindow time.Duration
	// restartMaxDelay caps every service's restart backoff.
	restartMaxDelay time.Duration
}

// podInfo is the workload's identity from Istio's environment variables.
type podInfo struct {
	name, namespace, serviceAccount string
	instanceIPs                     []string
}

// path places an agent path (Istio's "./etc/istio/proxy" or
// "/var/lib/istio") under --root.
func (c *agentConfig) path(p string) string {
	return filepath.Join(c.root, p)
}

func newProxyCommand(stderr io.Writer, logs *logOptions) *cobra.Command {
	f := &proxyFlags{}
	cmd := &cobra.Command{
		Use:   "proxy [sidecar|router|waypoint]",
		Short: "Runs the sidecar agent: the supervision tree around Envoy",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := parseAgentConfig(cmd, f, logs, args, os.LookupEnv, os.Environ, slog.New(slog.NewTextHandler(stderr, nil)))
			if err != nil {
				return err
			}
			log, err := newLogger(*logs, stderr)
			if err != nil {
				return usageError("%v", err)
			}
			return runAgent(cfg, log)
		},
	}
	addProxyFlags(cmd.Flags(), f)
	return cmd
}

func addProxyFlags(fl *pflag.FlagSet, f *proxyFlags) {
	fl.StringVar(&f.domain, "domain", "", "DNS domain suffix. If not provided uses ${POD_NAMESPACE}.svc.cluster.local")
	fl.StringVar(&f.meshConfig, "meshConfig", "./etc/istio/config/mesh", "File name for Istio mesh configuration. If not specified, a default mesh will be used.")
	fl.StringVar(&f.serviceCluster, "serviceCluster", "istio-proxy", "Service cluster")
	fl.StringVar(&f.proxyLogLevel, "proxyLogLevel", "warning", "The log level used to start the Envoy proxy (choose from {trace, debug, info, warning, error, critical, off}). Level may also include one or more scopes, such as 'info,misc:error,upstream:debug'")
	fl.StringVar(&f.proxyComponentLogLevel, "proxyComponentLogLevel", "", "The component log level used to start the Envoy proxy. Deprecated, use proxyLogLevel instead")
	fl.StringVar(&f.templateFile, "templateFile", "", "Go template bootstrap config")
	fl.StringVar(&f.outlierLogPath, "outlierLogPath", "", "The log path for outlier detection")
	fl.StringVar(&f.tokenManagerPlug, "tokenManagerPlugin", "GoogleTokenExchange", "Token provider specific plugin name (accepted for compatibility; meshagent has no STS server)")
	fl.IntVar(&f.stsPort, "stsPort", 0, "HTTP Port on which to serve Security Token Service (STS). If zero, STS service will not be provided (meshagent: only 0 is supported)")
	fl.IntVar(&f.concurrency, "concurrency", 0, "number of worker threads to run")
	fl.BoolVar(&f.profiling, "profiling", true, "Enable profiling via web interface host:port/debug/pprof/ (loopback callers only)")
	fl.StringVar(&f.root, "root", "/", "Directory under which every agent file path lives (env MESHAGENT_ROOT); / in production, a temp dir in tests")
	fl.StringVar(&f.nameTable, "name-table", "", "Serve DNS from this name table file (protojson of Istio's NDS NameTable), reloaded when it changes; turns the DNS proxy on")
	fl.StringVar(&f.resolvConf, "resolv-conf", "/etc/resolv.conf", "resolv.conf whose nameservers the DNS proxy forwards to and whose search list it uses")
	fl.BoolVar(&f.capture, "capture", false, "VM mode: apply the iptables capture rules from the ISTIO_* environment at start, re-apply them if flushed, remove them on stop (env MESHAGENT_CAPTURE=1); without it the agent only verifies rules an init container applied")
	fl.BoolVar(&f.chaos, "chaos", false, "Enable POST /debug/chaos/kill?service=NAME on the status port, loopback only (env MESHAGENT_CHAOS=1)")
	fl.IntVar(&f.envoyRestarts, "envoy-restarts", 5, "Restarts of a failed Envoy allowed within --envoy-restart-window before the agent exits; 0 exits when Envoy exits, as Istio's agent does")
	fl.DurationVar(&f.envoyRestartWindow, "envoy-restart-window", 5*time.Minute, "Window for --envoy-restarts")
	fl.DurationVar(&f.restartMaxDelay, "restart-max-delay", 30*time.Second, "Cap of the growing delay before a failed service is restarted (the first failure after a healthy run restarts at once)")
}

// parseAgentConfig is the one place where flags, environment and files
// become the agent's configuration: flag > environment > file > default.
func parseAgentConfig(cmd *cobra.Command, f *proxyFlags, logs *logOptions, args []string, lookup func(string) (string, bool), environ func() []string, log *slog.Logger) (*agentConfig, error) {
	env := func(k string) string { v, _ := lookup(k); return v }
	c := &agentConfig{
		proxyType: "sidecar", profiling: f.profiling,
		logLevel: f.proxyLogLevel, componentLogLevel: f.proxyComponentLogLevel, logAsJSON: logs.asJSON,
		templateFile: f.templateFile,
	}
	if len(args) == 1 {
		c.proxyType = args[0]
	}
	switch c.proxyType {
	case "sidecar", "router", "waypoint":
	default:
		return nil, usageError("proxy: unknown proxy type %q: want sidecar, router or waypoint", c.proxyType)
	}

	c.root = f.root
	if !cmd.Flags().Changed("root") {
		if v, ok := lookup("MESHAGENT_ROOT"); ok && v != "" {
			c.root = v
		}
	}
	if !filepath.IsAbs(c.root) {
		abs, err := filepath.Abs(c.root)
		if err != nil {
			return nil, usageError("--root %q: %v", c.root, err)
		}
		c.root = abs
	}
	if st, err := os.Stat(c.root); err != nil || !st.IsDir() {
		return nil, usageError("--root %q: not a directory", c.root)
	}

	c.chaos = f.chaos
	if !cmd.Flags().Changed("chaos") {
		if v, ok := lookup("MESHAGENT_CHAOS"); ok && v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, usageError("MESHAGENT_CHAOS=%q: want true or false", v)
			}
			c.chaos = b
		}
	}

	if f.envoyRestarts < 0 {
		return nil, usageError("--envoy-restarts %d: must be 0 or more", f.envoyRestarts)
	}
	if f.envoyRestartWindow <= 0 {
		return nil, usageError("--envoy-restart-window %s: must be positive", f.envoyRestartWindow)
	}
	c.envoyRestarts, c.envoyRestartWindow = f.envoyRestarts, f.envoyRestartWindow
	if f.restartMaxDelay < 100*time.Millisecond {
		return nil, usageError("--restart-max-delay %s: must be at least 100ms", f.restartMaxDelay)
	}
	c.restartMaxDelay = f.restartMaxDelay
	if f.stsPort != 0 {
		return nil, usageError("--stsPort %d: meshagent has no STS server; only 0 is supported", f.stsPort)
	}
	if f.concurrency < 0 {
		return nil, usageError("--concurrency %d: must be 0 or more", f.concurrency)
	}
	if _, err := parseLogLevel(logs.outputLevel); err != nil {
		return nil, usageError("%v", err)
	}

	c.pod = podInfo{
		name:           env("POD_NAME"),
		namespace:      env("POD_NAMESPACE"),
		serviceAccount: env("SERVICE_ACCOUNT"),
	}
	if ip := env("INSTANCE_IP"); ip != "" {
		for _, s := range strings.Split(ip, ",") {
			if net.ParseIP(strings.TrimSpace(s)) == nil {
				return nil, usageError("INSTANCE_IP=%q: %q is not an IP address", ip, s)
			}
			c.pod.instanceIPs = append(c.pod.instanceIPs, strings.TrimSpace(s))
		}
	}
	c.domain = f.domain
	if c.domain == "" {
		c.domain = c.pod.namespace + ".svc.cluster.local"
	}
	c.nodeIPs = nodeIPs(c.pod.instanceIPs)
	if cmd.Flags().Changed("serviceCluster") {
		c.serviceCluster = f.serviceCluster
	}

	envs := &envReader{lookup: lookup, environ: environ}
	c.envoy = readEnvoySettings(envs, f.outlierLogPath)
	c.dnsEnabled = envs.boolean("ISTIO_META_DNS_CAPTURE", false) && c.proxyType == "sidecar" ||
		envs.boolean("ISTIO_META_ENABLE_DNS_SERVER", false)
	c.dnsAddr = envs.str("DNS_PROXY_ADDR", "localhost:15053")

	pc, err := loadProxyConfig(proxyConfigSources{
		meshConfigFile:  c.path(f.meshConfig),
		proxyConfigEnv:  env("PROXY_CONFIG"),
		annotationsFile: c.path("./etc/istio/pod/annotations"),
	}, log)
	if err != nil {
		return nil, usageError("%v", err)
	}
	if cmd.Flags().Changed("concurrency") {
		pc.Concurrency = nil
		if f.concurrency > 0 {
			pc.Concurrency = wrapInt32(f.concurrency)
		}
	}
	if err := validateProxyConfig(pc); err != nil {
		return nil, usageError("invalid proxy configuration: %v", err)
	}
	c.proxy = pc

	vm := f.capture
	if !cmd.Flags().Changed("capture") {
		vm = envs.boolean("MESHAGENT_CAPTURE", false)
	}
	if c.capture, err = captureConfig(lookup, vm, log); err != nil {
		return nil, usageError("%v", err)
	}
	if f.nameTable != "" {
		c.nameTableFile = f.nameTable
		c.dnsEnabled = true
	}
	if c.dnsEnabled {
		c.dns = &dnsproxy.Config{
			Listen:          c.dnsAddr,
			ResolvConf:      f.resolvConf,
			Namespace:       c.pod.namespace,
			Domain:          c.domain,
			ForwardTimeout:  envs.duration("DNS_FORWARD_TIMEOUT", 5*time.Second),
			ForwardParallel: envs.boolean("DNS_FORWARD_PARALLEL", false),
		}
	}
	c.certs, c.sds = c.identityConfigs(envs)
	c.bootstrap = c.envoyBootstrap()
	c.envoyCfg = c.envoyConfig()
	// Every bad environment variable at once, each named.
	if err := envs.err(); err != nil {
		return nil, usageError("%v", err)
	}
	if err := c.validateServices(); err != nil {
		return nil, usageError("%v", err)
	}
	return c, nil
}

// validateServices checks every service's config before anything starts.
func (c *agentConfig) validateServices() error {
	var errs []error
	if c.certs != nil {
		errs = append(errs, c.certs.Validate())
	}
	if c.sds != nil {
		errs = append(errs, c.sds.Validate())
	}
	if c.dns != nil {
		errs = append(errs, c.dns.Validate())
	}
	if c.envoyCfg != nil {
		errs = append(errs, c.envoyCfg.Validate())
		errs = append(errs, c.bootstrap.Validate())
	}
	return errors.Join(errs...)
}

// treeConfig turns the agent's configuration into each service's config.
func (c *agentConfig) treeConfig(reg *prometheus.Registry) tree.Config {
	tc := tree.Config{
		DefaultPolicy: tree.DefaultPolicy(),
		EnvoyPolicy:   tree.DefaultPolicy(),
		StopTimeout:   10 * time.Second,
	}
	tc.DefaultPolicy.MaxDelay = c.restartMaxDelay
	tc.EnvoyPolicy.MaxDelay = c.restartMaxDelay
	tc.EnvoyPolicy.GiveUp = &tree.GiveUp{Restarts: c.envoyRestarts, Window: c.envoyRestartWindow}
	drain := c.proxy.GetTerminationDrainDuration().AsDuration()
	tc.DrainTimeout = drain + 15*time.Second
	if d := drain + 10*time.Second; d > tc.StopTimeout {
		tc.StopTimeout = d
	}
	tc.Certs = c.certs
	tc.SDS = c.sds
	tc.Envoy = c.envoyCfg
	tc.Capture = c.capture
	tc.DNS = c.dns
	tc.NameTableFile = c.nameTableFile
	if c.proxy.StatusPort != 0 {
		tc.Status = &status.Config{
			Addr:      fmt.Sprintf(":%d", c.proxy.StatusPort),
			Chaos:     c.chaos,
			Profiling: c.profiling,
			Gatherer:  reg,
		}
	}
	return tc
}

// runAgent builds the tree and runs it until a signal, /quitquitquit or a
// give-up. SIGTERM/SIGINT drain gracefully; a second signal stops at once;
// a third exits on the spot.
func runAgent(cfg *agentConfig, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	agent, ch, err := tree.Build(cfg.treeConfig(reg), reg, log, tree.SystemdNotifier{})
	if err != nil {
		return err
	}
	log.Info("meshagent starting", "version", buildVersion, "type", cfg.proxyType, "root", cfg.root,
		"status_port", cfg.proxy.StatusPort, "chaos", cfg.chaos)

	sigs := make(chan os.Signal, 3)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	stopSignals := make(chan struct{})
	signalsDone := make(chan struct{})
	go func() {
		defer close(signalsDone)
		for n := 1; ; n++ {
			select {
			case sig := <-sigs:
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
