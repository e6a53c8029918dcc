package config

import "time"

// ProxyFlags are the `proxy` command's flags: Istio's pilot-agent flags
// plus meshagent's own. A pointer stays nil when the flag was not given,
// where that differs from any value.
type ProxyFlags struct {
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
	Root               string
	chaos              bool
	Capture            bool
	captureInterval    time.Duration
	nameTable          string
	resolvConf         string
	envoyRestarts      int
	envoyRestartWindow time.Duration
	hotRestart         bool
	restartMaxDelay    time.Duration
}

func BindProxyFlags(s *Settings, f *ProxyFlags) {
	str := func(p *string, name, def, usage string) {
		flagVar(s, p, def, parseString, flagSpec{name: name, usage: usage})
	}
	str(&f.domain, "domain", "", "DNS domain suffix. If not provided uses ${POD_NAMESPACE}.svc.cluster.local")
	optionalFlagVar(s, &f.meshConfig, parseString, flagSpec{name: "meshConfig",
		usage: "File name for Istio mesh configuration (under --root; default " + MeshConfigFile + "). If not specified and the default file does not exist, a default mesh will be used; a file named here must exist"})
	optionalFlagVar(s, &f.serviceCluster, parseString, flagSpec{name: "serviceCluster", usage: "Service cluster (default istio-proxy; given, it wins over ProxyConfig's)"})
	str(&f.proxyLogLevel, "proxyLogLevel", "warning", "The log level used to start the Envoy proxy (choose from {trace, debug, info, warning, error, critical, off}). Level may also include one or more scopes, such as 'info,misc:error,upstream:debug'")
	str(&f.proxyComponentLogLevel, "proxyComponentLogLevel", "", "The component log level used to start the Envoy proxy. Deprecated, use proxyLogLevel instead")
	str(&f.templateFile, "templateFile", "", "Go template bootstrap config")
	str(&f.outlierLogPath, "outlierLogPath", "", "The log path for outlier detection")
	str(&f.tokenManagerPlugin, "tokenManagerPlugin", "GoogleTokenExchange", "Token provider specific plugin name (accepted for compatibility; meshagent has no STS server)")
	flagVar(s, &f.stsPort, 0, parseCount, flagSpec{name: "stsPort", usage: "HTTP Port on which to serve Security Token Service (STS). If zero, STS service will not be provided (meshagent: only 0 is supported)"})
	optionalFlagVar(s, &f.concurrency, parseCount, flagSpec{name: "concurrency", usage: "number of worker threads to run (legacy: prefer ProxyConfig.concurrency; 0 or unset leaves it alone)"})
	flagVar(s, &f.profiling, true, parseBool, flagSpec{name: "profiling", usage: "Enable profiling via web interface host:port/debug/pprof/ (loopback callers only)"})

	envFlagVar(s, &f.Root, flagSpec{name: "root", usage: "Directory under which every agent file path lives; / in production, a temp dir in tests"}, envMeshagentRoot)
	str(&f.nameTable, "name-table", "", "Serve DNS from this name table file (protojson of Istio's NDS NameTable), reloaded when it changes; turns the DNS proxy on")
	str(&f.resolvConf, "resolv-conf", ResolvConfFile, "resolv.conf whose nameservers the DNS proxy forwards to and whose search list it uses")
	envFlagVar(s, &f.Capture, flagSpec{name: "capture",
		usage: "VM mode: apply the iptables capture rules from the ISTIO_* environment at start, re-apply them if flushed, remove them on stop; without it the agent only verifies rules an init container applied"}, envMeshagentCapture)
	envFlagVar(s, &f.captureInterval, flagSpec{name: "capture-check-interval",
		usage: "VM mode: how often the capture rules are checked and re-applied if someone flushed or changed them"}, envMeshagentCaptureCheckInterval)
	envFlagVar(s, &f.chaos, flagSpec{name: "chaos", usage: "Enable POST /debug/chaos/kill?service=NAME on the status port, loopback only"}, envMeshagentChaos)
	flagVar(s, &f.envoyRestarts, 5, parseCount, flagSpec{name: "envoy-restarts", usage: "Restarts of a failed Envoy allowed within --envoy-restart-window before the agent exits; 0 exits when Envoy exits, as Istio's agent does"})
	flagVar(s, &f.envoyRestartWindow, 5*time.Minute, parseDuration, flagSpec{name: "envoy-restart-window", usage: "Window for --envoy-restarts"})
	envFlagVar(s, &f.hotRestart, flagSpec{name: "hot-restart",
		usage: "Apply a change of Envoy's bootstrap (mesh config file, ProxyConfig annotation, template) or of its binary by an Envoy hot restart, without refusing a connection; off: Istio's --disable-hot-restart"}, envMeshagentHotRestart)
	flagVar(s, &f.restartMaxDelay, 30*time.Second, parseDuration, flagSpec{name: "restart-max-delay", usage: "Cap of the growing delay before a failed service is restarted (the first failure after a healthy run restarts at once)"})
}
