package main

// The configuration pipeline of `proxy`, in one function: the flags, the
// environment, the host and the files under --root go in, every service's
// config comes out as one validated tree.Config.
//
//	flags ──► settings (flag, else env, else default; flagenv.go)
//	                │
//	environment, host, files ──► buildAgentConfig
//	                │   ProxyConfig: Istio's defaults < (standalone's) < mesh file < PROXY_CONFIG < annotations (proxyconfig.go)
//	                │   the root's lock, one agent per root (rootlock.go)
//	                │   pod, dns, identity, envoy, capture, status: one builder each (*config.go),
//	                │   Istio's names and paths from istio.go
//	                ▼
//	tree.Config ──► Validate (every service, once) ──► ports tried (portcheck.go, runAgent)
//	            ──► logged once (effective.go) ──► tree.Build
//
// Every bad input stops the agent here, exit 2, naming the flag, variable,
// file or port and the value (#21): never a run that fails later, or for
// a reason it does not name.
//
// A setting is added in the builder of the service that uses it (the flag
// or variable, its default and its mapping, on one line or two) and in the
// service's Config.

import (
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/services/nametable"
	"github.com/meshagent/meshagent/tree"
)

// agentInputs is everything a `proxy` run is configured from.
type agentInputs struct {
	flags *proxyFlags
	args  []string // positional: the proxy type
	logs  logOptions
	host  hostInputs
	// gatherer is the metrics registry the status server serves.
	gatherer prometheus.Gatherer
	// problems holds the bad values found so far (the flags'); the build
	// adds its own and reports them all. Nil: none yet.
	problems *problems
	// log receives warnings while building (unknown ProxyConfig fields).
	log *slog.Logger
	// standalone is what `meshagent standalone` adds (standaloneconfig.go):
	// a ProxyConfig layer under the user's and the embedded peers. Nil for
	// `proxy`.
	standalone *standaloneLayer
	// envoyRunAs, when not nil, is the uid/gid Envoy runs as (`meshagent
	// vm`); the agent's sockets are then chowned to it.
	envoyRunAs *envoy.Credential
	// noCapture leaves iptables alone: no capture service
	// (ISTIO_CUSTOM_IP_TABLES=true on a VM).
	noCapture bool
}

// agentConfig is the agent as built: the tree's config, and what the start
// log line shows besides it.
type agentConfig struct {
	proxyType string
	root      string
	proxy     *meshconfig.ProxyConfig
	tree      tree.Config
	// lock is the root's lock (rootlock.go), held while the agent runs;
	// nil when none was taken.
	lock io.Closer
	// env is the environment the config was built from (standalone's and a
	// VM's are layered on the process's): its Reads are what the start read.
	env *config.Reader
	// gogc is GOGC as the operator set it (even empty); nil: the agent
	// sets its own GC target (memory.go).
	gogc *string
}

// release drops the root's lock: at exit, or when the run stops before
// the tree starts (in-process tests run many commands on one root).
func (c *agentConfig) release() {
	if c != nil && c.lock != nil {
		c.lock.Close()
		c.lock = nil
	}
}

// podInfo is the workload's identity and addresses.
type podInfo struct {
	name, namespace, serviceAccount string // POD_NAME, POD_NAMESPACE, SERVICE_ACCOUNT
	// nodeIPs are INSTANCE_IP's addresses, then the host's private ones;
	// the first is in Envoy's node id.
	nodeIPs []string
	// instanceIP is INSTANCE_IP's first address ("" when unset or bad):
	// where the application's probes go (Istio's PodIP).
	instanceIP string
	domain     string // --domain, else <namespace>.svc.cluster.local
}

// sharedVars are the variables more than one service's config uses, read
// once and handed to each (#26: PROV_CERT was read three times). All are
// plain strings: reading them where a builder would not (PILOT_CERT_PROVIDER
// =none) reports nothing.
type sharedVars struct {
	provCert    string // PROV_CERT: the CA's and istiod's roots (certs, xdsproxy)
	outputCerts string // OUTPUT_CERTS: where certs writes, what proxyless gRPC reads
	istiodSAN   string // ISTIOD_SAN: istiod's name, as the CA and as the control plane
	clusterID   string // ISTIO_META_CLUSTER_ID: in CSRs and xDS requests
	// workloadSocketFile is WORKLOAD_IDENTITY_SOCKET_FILE: the SDS socket's
	// name, which Envoy's bootstrap names too.
	workloadSocketFile string
}

func readSharedVars(r envReader) sharedVars {
	return sharedVars{
		provCert:           envVar(r, "PROV_CERT", "", config.ParseString),
		outputCerts:        envVar(r, "OUTPUT_CERTS", "", config.ParseString),
		istiodSAN:          envVar(r, "ISTIOD_SAN", "", config.ParseString),
		clusterID:          envVar(r, "ISTIO_META_CLUSTER_ID", "", config.ParseString),
		workloadSocketFile: envVar(r, "WORKLOAD_IDENTITY_SOCKET_FILE", workloadSocketFile, config.ParseString),
	}
}

// buildAgentConfig turns the inputs into every service's config, validated.
// Every bad value — of a flag, a variable, a file, a service's config — is
// in the error, each naming where it came from and the value.
func buildAgentConfig(in agentInputs) (*agentConfig, error) {
	p := in.problems
	if p == nil {
		p = &problems{}
	}
	r := envReader{env: in.host.env, problems: p}
	f := in.flags
	c := &agentConfig{proxyType: "sidecar", root: checkRoot(f.root, p), env: in.host.env}
	if v, ok := in.host.env.Lookup("GOGC"); ok {
		c.gogc = &v
	}
	if len(in.args) > 0 {
		c.proxyType = in.args[0]
	}
	switch {
	case len(in.args) > 1:
		p.addf("proxy: %q: want at most one argument, the proxy type", in.args)
	case c.proxyType != "sidecar" && c.proxyType != "router" && c.proxyType != "waypoint":
		p.addf("proxy: unknown proxy type %s: want sidecar, router or waypoint", config.QuoteValue(c.proxyType))
		// Reported once: the rest of the build goes on as a sidecar, so
		// that the bootstrap's check does not say it again (#21).
		c.proxyType = "sidecar"
	}
	if _, err := parseLogLevel(in.logs.outputLevel); err != nil {
		p.add(err)
	}
	if f.stsPort != 0 {
		p.addf("--stsPort %d: meshagent has no STS server; only 0 is supported", f.stsPort)
	}
	if f.restartMaxDelay < 100*time.Millisecond {
		p.addf("--restart-max-delay %s: must be at least 100ms (the first restart's delay)", f.restartMaxDelay)
	}
	if f.envoyRestartWindow <= 0 {
		p.addf("--envoy-restart-window %s: must be positive", f.envoyRestartWindow)
	}
	if c.root == "" {
		return nil, p.err() // nothing under it can be read
	}

	pod := podConfig(r, f, in.host)
	meshFile := meshConfigFile
	if f.meshConfig != nil {
		meshFile = *f.meshConfig
	}
	pcSources := proxyConfigSources{
		injected:        in.standalone.proxyConfigLayer(),
		meshConfigFile:  rooted(c.root, meshFile),
		meshConfigFlag:  f.meshConfig,
		proxyConfigEnv:  envVar(r, "PROXY_CONFIG", "", config.ParseString),
		annotationsFile: rooted(c.root, podAnnotationsFile),
	}
	pc, err := loadProxyConfig(pcSources, in.log)
	if err != nil {
		p.add(err)
		return nil, p.err() // every service's config depends on it
	}
	applyConcurrency(pc, optionalEnvVar(r, "ISTIO_CPU_LIMIT", config.ParseCount), f.concurrency, in.log)
	if err := validateProxyConfig(pc); err != nil {
		p.addf("invalid proxy configuration: %w", err)
		return nil, p.err()
	}
	c.proxy = pc
	// Before anything looks at the sockets under the root: a second agent
	// would take the first one's SDS socket for an external SDS server.
	if in.host.lockRoot != nil {
		lock, err := in.host.lockRoot(rooted(c.root, pc.ConfigPath))
		switch {
		case errors.Is(err, errRootLocked):
			p.addf("--root %s: %w; stop it, or give this agent a --root of its own", c.root, err)
			return nil, p.err()
		case err != nil:
			// A configPath the agent cannot write fails later with its
			// own message (the bootstrap, the XDS socket).
			in.log.Warn("cannot take the one-agent-per-root lock; a second agent on this root would not be detected", "error", err)
		}
		c.lock = lock
	}

	dns := dnsConfig(r, f, pod, c.proxyType)
	shared := readSharedVars(r)
	certsCfg, sdsCfg := identityConfig(r, c.root, pod, shared, pc)
	sdsSocket := rooted(c.root, workloadIdentityDir+"/"+workloadSocketFile)
	filesSDSSocket := ""
	if sdsCfg != nil {
		sdsSocket = sdsCfg.EnvoySocketPath()
		if certsCfg == nil { // an external SDS server serves the identity: ours, files only
			filesSDSSocket = sdsCfg.FilesSocketPath
		}
	}
	envoyIn := envoyInputs{root: c.root, proxyType: c.proxyType, flags: f, logAsJSON: in.logs.asJSON,
		pod: pod, proxy: pc, dns: dns, shared: shared, euid: in.host.euid, runAs: in.envoyRunAs, sdsSocket: sdsSocket, filesSDSSocket: filesSDSSocket,
		lookPath: in.host.lookPath}
	envoyCfg, bootstrap := envoyConfig(r, envoyIn)
	if f.hotRestart && envoyCfg != nil {
		envoyCfg.HotRestart = hotRestartConfig(in, pcSources, envoyIn, envoyCfg)
	}
	envoyUID, envoyGID := -1, -1
	if envoyCfg != nil && envoyCfg.RunAs != nil {
		envoyUID, envoyGID = int(envoyCfg.RunAs.UID), int(envoyCfg.RunAs.GID)
		if sdsCfg != nil { // Envoy must reach the SDS socket as well as the XDS one
			sdsCfg.SocketOwner.UID, sdsCfg.SocketOwner.GID = int(envoyCfg.RunAs.UID), int(envoyCfg.RunAs.GID)
		}
	}
	c.tree = tree.Config{
		Certs:   certsCfg,
		SDS:     sdsCfg,
		Envoy:   envoyCfg,
		Capture: captureConfig(r, f, in.host, in.log),
		XDS: xdsConfig(r, xdsInputs{root: c.root, proxy: pc, envoyBootstrap: bootstrap, certs: certsCfg, shared: shared,
			nds: dns.enabled() && f.nameTable == "", envoyUID: envoyUID, envoyGID: envoyGID}),
		DNS: dns.proxy,
	}
	if f.nameTable != "" {
		c.tree.NameTable = &nametable.Config{File: f.nameTable}
	}
	if in.noCapture {
		c.tree.Capture = nil
	}
	c.tree.Status = statusConfig(r, statusInputs{proxyType: c.proxyType, flags: f, instanceIP: pod.instanceIP, proxy: pc, envoy: c.tree.Envoy, gatherer: in.gatherer})
	c.tree.ControlPlane, c.tree.CA = in.standalone.peers(c.root, certsCfg)
	treePolicies(&c.tree, f, pc)
	p.add(c.tree.Validate())
	if err := p.err(); err != nil {
		c.release()
		return nil, err
	}
	return c, nil
}

// checkRoot returns --root (MESHAGENT_ROOT) as an absolute path to a
// directory, or "" after reporting why it is not one.
func checkRoot(root string, p *problems) string {
	abs, err := filepath.Abs(root)
	if err != nil {
		p.addf("--root %s: %v", config.QuoteValue(root), err)
		return ""
	}
	switch st, err := os.Stat(abs); {
	case errors.Is(err, fs.ErrNotExist):
		p.addf("--root %s: %s does not exist", config.QuoteValue(root), abs)
	case err != nil:
		p.addf("--root %s: %v", config.QuoteValue(root), err)
	case !st.IsDir():
		p.addf("--root %s: %s is not a directory", config.QuoteValue(root), abs)
	default:
		return abs
	}
	return ""
}

// podConfig is the workload's identity from Istio's environment, and its
// IPs: INSTANCE_IP first, then the host's private addresses (Istio's
// getDNSDomain and IP discovery).
func podConfig(r envReader, f *proxyFlags, host hostInputs) podInfo {
	pod := podInfo{
		name:           envVar(r, "POD_NAME", "", config.ParseString),
		namespace:      envVar(r, "POD_NAMESPACE", "", config.ParseDNSLabel),
		serviceAccount: envVar(r, "SERVICE_ACCOUNT", "", config.ParseDNSSubdomain),
		domain:         f.domain,
	}
	if pod.domain == "" {
		pod.domain = pod.namespace + ".svc.cluster.local"
	}
	if v, ok := r.env.Text("INSTANCE_IP"); ok {
		for i, s := range strings.Split(v, ",") {
			ip, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil {
				r.problems.addf("INSTANCE_IP=%s: %s is not an IP address", config.QuoteValue(v), config.QuoteValue(s))
				continue
			}
			if i == 0 {
				pod.instanceIP = ip.String()
			}
			pod.nodeIPs = append(pod.nodeIPs, ip.String())
		}
	}
	pod.nodeIPs = appendHostIPs(pod.nodeIPs, host, r.problems)
	return pod
}

// appendHostIPs adds the host's addresses not already in ips, as Istio's
// agent lists them (GetPrivateIPs, despite its name: every address but
// loopback, link-local and unspecified ones); with none, 127.0.0.1 and ::1.
func appendHostIPs(ips []string, host hostInputs, p *problems) []string {
	var found []string
	if host.interfaceAddrs != nil {
		addrs, err := host.interfaceAddrs()
		if err != nil {
			p.addf("listing the host's addresses: %v", err)
			return ips
		}
		for _, a := range addrs {
			ip := a.Addr().Unmap()
			if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() {
				continue
			}
			found = append(found, ip.String())
		}
	}
	if len(found) == 0 {
		found = []string{"127.0.0.1", "::1"}
	}
	for _, s := range found {
		if !slices.Contains(ips, s) {
			ips = append(ips, s)
		}
	}
	return ips
}

// treePolicies sets the restart policies and stop timeouts: the drain
// bound and the stop timeout cover terminationDrainDuration plus Envoy's
// SIGTERM-to-SIGKILL grace.
func treePolicies(tc *tree.Config, f *proxyFlags, pc *meshconfig.ProxyConfig) {
	tc.DefaultPolicy, tc.EnvoyPolicy = tree.DefaultPolicy(), tree.DefaultPolicy()
	tc.DefaultPolicy.MaxDelay, tc.EnvoyPolicy.MaxDelay = f.restartMaxDelay, f.restartMaxDelay
	tc.EnvoyPolicy.GiveUp = &tree.GiveUp{Restarts: f.envoyRestarts, Window: f.envoyRestartWindow}
	drain := pc.GetTerminationDrainDuration().AsDuration()
	tc.DrainTimeout = drain + drainStopMargin
	tc.StopTimeout = max(serviceStopTimeout, drain+envoyStopMargin)
}
