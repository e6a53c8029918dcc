package main

import (
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/services/envoy"
)

// envoySettings are the environment variables that shape Envoy's bootstrap
// and lifecycle, with Istio's names and defaults.
type envoySettings struct {
	istioBootstrap       string // ISTIO_BOOTSTRAP
	overrideFile         string // ISTIO_BOOTSTRAP_OVERRIDE
	hostIP               string // HOST_IP
	deltaXDS             bool   // ISTIO_DELTA_XDS (true)
	dualStack            bool   // ISTIO_DUAL_STACK
	metricsLocalhostOnly bool   // METRICS_LOCALHOST_ACCESS_ONLY
	exitOnZeroActive     bool   // EXIT_ON_ZERO_ACTIVE_CONNECTIONS
	minimumDrain         time.Duration
	skipDeprecatedLogs   bool // ENVOY_SKIP_DEPRECATED_LOGS (true)
	enableCoreDump       bool // ISTIO_ENVOY_ENABLE_CORE_DUMP
	metadataDiscovery    bool // METADATA_DISCOVERY
	cpuLimit             int  // ISTIO_CPU_LIMIT
	outlierLogPath       string
	disabled             bool // DISABLE_ENVOY
	statusPort           int  // ENVOY_STATUS_PORT (15021)
	prometheusPort       int  // ENVOY_PROMETHEUS_PORT (15090)
}

func readEnvoySettings(e *envReader, outlierFlag string) envoySettings {
	s := envoySettings{
		istioBootstrap:       e.str("ISTIO_BOOTSTRAP", ""),
		overrideFile:         e.str("ISTIO_BOOTSTRAP_OVERRIDE", ""),
		hostIP:               e.str("HOST_IP", ""),
		deltaXDS:             e.boolean("ISTIO_DELTA_XDS", true),
		dualStack:            e.boolean("ISTIO_DUAL_STACK", false),
		metricsLocalhostOnly: e.boolean("METRICS_LOCALHOST_ACCESS_ONLY", false),
		exitOnZeroActive:     e.boolean("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", false),
		minimumDrain:         e.duration("MINIMUM_DRAIN_DURATION", 5*time.Second),
		skipDeprecatedLogs:   e.boolean("ENVOY_SKIP_DEPRECATED_LOGS", true),
		enableCoreDump:       e.boolean("ISTIO_ENVOY_ENABLE_CORE_DUMP", false),
		metadataDiscovery:    e.boolean("METADATA_DISCOVERY", false),
		cpuLimit:             e.integer("ISTIO_CPU_LIMIT", 0),
		outlierLogPath:       outlierFlag,
		disabled:             e.boolean("DISABLE_ENVOY", false),
		statusPort:           e.integer("ENVOY_STATUS_PORT", 15021),
		prometheusPort:       e.integer("ENVOY_PROMETHEUS_PORT", 15090),
	}
	if s.outlierLogPath == "" {
		s.outlierLogPath = e.str("OUTLIER_LOG_PATH", "")
	}
	return s
}

// nodeIPs are the workload's IPs as Istio's agent finds them: INSTANCE_IP
// first, then the host's private addresses; 127.0.0.1 if there are none.
func nodeIPs(instanceIPs []string) []string {
	ips := append([]string(nil), instanceIPs...)
	seen := map[string]bool{}
	for _, ip := range ips {
		seen[ip] = true
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || !ipn.IP.IsPrivate() || seen[ipn.IP.String()] {
			continue
		}
		seen[ipn.IP.String()] = true
		ips = append(ips, ipn.IP.String())
	}
	if len(ips) == 0 {
		ips = []string{"127.0.0.1"}
	}
	return ips
}

// envoyBootstrap is what the bootstrap writer needs, from the agent's
// configuration.
func (c *agentConfig) envoyBootstrap() envoy.BootstrapConfig {
	pc := c.proxy
	configPath := c.path(pc.ConfigPath)
	b := envoy.BootstrapConfig{
		ProxyType:                   c.proxyType,
		PodName:                     c.pod.name,
		PodNamespace:                c.pod.namespace,
		ServiceAccount:              c.pod.serviceAccount,
		InstanceIPs:                 c.nodeIPs,
		Domain:                      c.domain,
		ServiceCluster:              c.serviceCluster,
		IstioVersion:                buildVersion,
		Proxy:                       pc,
		Env:                         os.Environ(),
		LabelsFile:                  c.path("./etc/istio/pod/labels"),
		AnnotationsFile:             c.path("./etc/istio/pod/annotations"),
		ConfigPath:                  configPath,
		XDSSocket:                   c.path(pc.ConfigPath + "/XDS"),
		SDSSocket:                   c.sdsSocket(),
		AdminPort:                   int(pc.ProxyAdminPort),
		StatusPort:                  int(pc.StatusPort),
		EnvoyStatusPort:             15021,
		EnvoyPrometheusPort:         15090,
		IstioBootstrap:              c.envoy.istioBootstrap,
		TemplateFile:                c.templateFile,
		OverrideFile:                c.envoy.overrideFile,
		HostIP:                      c.envoy.hostIP,
		DeltaXDS:                    c.envoy.deltaXDS,
		DualStack:                   c.envoy.dualStack,
		LogAsJSON:                   c.logAsJSON,
		MetricsLocalhostOnly:        c.envoy.metricsLocalhostOnly,
		ExitOnZeroActiveConnections: c.envoy.exitOnZeroActive,
		OutlierLogPath:              c.envoy.outlierLogPath,
		MetadataDiscovery:           c.envoy.metadataDiscovery,
	}
	if c.dnsEnabled {
		b.DNSProxyAddr = c.dnsAddr
	}
	return b
}

// envoyArgs is Envoy's command line, from the agent's configuration.
func (c *agentConfig) envoyArgs() envoy.ArgsConfig {
	pc := c.proxy
	a := envoy.DefaultArgsConfig()
	a.DrainDuration = pc.GetDrainDuration().AsDuration()
	if d := pc.GetFileFlushInterval(); d != nil {
		a.FileFlushInterval = d.AsDuration()
	}
	a.FileFlushMinSizeKB = int(pc.GetFileFlushMinSizeKb())
	a.LogLevel = c.logLevel
	a.ComponentLogLevel = c.componentLogLevel
	a.Concurrency = int(pc.GetConcurrency().GetValue())
	if pc.GetConcurrency() == nil && c.envoy.cpuLimit > 0 {
		a.Concurrency = c.envoy.cpuLimit
	}
	a.IPv6 = envoy.AllIPv6(c.nodeIPs)
	a.SkipDeprecatedLogs = c.envoy.skipDeprecatedLogs
	a.EnableCoreDump = c.envoy.enableCoreDump
	return a
}

// sdsSocket is the workload SDS socket Envoy is pointed at.
func (c *agentConfig) sdsSocket() string {
	return c.path("./var/run/secrets/workload-spiffe-uds/socket")
}

// envoyConfig is the envoy service's config: the binary, a Prepare that
// writes the bootstrap and builds the command line before every start, and
// the drain settings. nil with DISABLE_ENVOY (proxyless gRPC).
func (c *agentConfig) envoyConfig() *envoy.Config {
	if c.envoy.disabled {
		return nil
	}
	bootstrap, args := c.bootstrap, c.envoyArgs()
	admin := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(c.proxy.ProxyAdminPort)))
	if envoy.AllIPv6(c.nodeIPs) {
		admin = net.JoinHostPort("::1", strconv.Itoa(int(c.proxy.ProxyAdminPort)))
	}
	ec := &envoy.Config{
		BinaryPath: c.proxy.BinaryPath,
		Prepare: func() ([]string, error) {
			b, err := envoy.WriteBootstrap(bootstrap)
			if err != nil {
				return nil, err
			}
			return envoy.CommandLine(args, b), nil
		},
		AdminAddr:                   admin,
		TerminationDrainDuration:    c.proxy.GetTerminationDrainDuration().AsDuration(),
		MinimumDrainDuration:        c.envoy.minimumDrain,
		ExitOnZeroActiveConnections: c.envoy.exitOnZeroActive,
	}
	// Istio runs Envoy as 1337 only when the agent is root and the DNS
	// proxy takes port 53 (otherwise the container already runs as 1337).
	if os.Geteuid() == 0 && c.dnsEnabled && strings.HasSuffix(c.dnsAddr, ":53") {
		ec.RunAs = &envoy.Credential{UID: 1337, GID: 1337}
	}
	return ec
}
