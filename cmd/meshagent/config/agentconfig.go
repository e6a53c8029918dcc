package config

// The configuration pipeline of `proxy`, in one function: the flags, the
// environment, the host and the files under --root go in, every service's
// config comes out as one tree.Config.
//
//	flags ──► settings (flag, else env, else default; flagenv.go)
//	                │
//	environment, Host, files ──► Build
//	                │   ProxyConfig: Istio's defaults < (standalone's) < mesh file < PROXY_CONFIG < annotations (proxyconfig.go)
//	                │   the root's lock, one agent per root (Host.LockRoot: cmd's rootlock.go)
//	                │   pod, dns, identity, envoy, capture, status: one builder each (*config.go),
//	                │   Istio's names and paths from istio.go
//	                ▼
//	tree.Config ──► (cmd) tree.Build: each service's New validates its config, the only check of it (#26)
//	            ──► ports tried (cmd's portcheck.go) ──► logged once (effective.go) ──► run
//
// Every bad input stops the agent before it runs, exit 2, naming the flag,
// variable, file or port and the value (#21): never a run that fails
// later, or for a reason it does not name. The builders check what only
// they can name (a flag, a variable, a layer of the ProxyConfig); a
// service's own rules are its New's, and its errors name the variable too.
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

	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/services/nametable"
	"github.com/meshagent/meshagent/tree"
)

// Inputs is everything a `proxy` run is configured from.
type Inputs struct {
	Flags *ProxyFlags
	Args  []string // positional: the proxy type
	// LogLevel and LogAsJSON are Istio's --log_output_level and
	// --log_as_json: the level is checked with the other values, and Envoy
	// logs as JSON when the agent does.
	LogLevel  string
	LogAsJSON bool
	// Version is the agent's version: Envoy's node metadata, the start log.
	Version string
	Host    Host
	// Gatherer is the metrics registry the status server serves.
	Gatherer prometheus.Gatherer
	// Problems holds the bad values found so far (the flags'); the build
	// adds its own and reports them all. Nil: none yet.
	Problems *Problems
	// Log receives warnings while building (unknown ProxyConfig fields).
	Log *slog.Logger
	// standalone is what `meshagent standalone` adds (standaloneconfig.go):
	// a ProxyConfig layer under the user's and the embedded peers. Nil for
	// `proxy`.
	standalone *standaloneLayer
	// EnvoyRunAs, when not nil, is the uid/gid Envoy runs as (`meshagent
	// vm`); the agent's sockets are then chowned to it.
	EnvoyRunAs *envoy.Credential
	// noCapture leaves iptables alone: no capture service
	// (ISTIO_CUSTOM_IP_TABLES=true on a VM).
	NoCapture bool
}

// Agent is the agent as built: the tree's config, and what the start
// log line shows besides it.
type Agent struct {
	ProxyType string
	Root      string
	Proxy     *meshconfig.ProxyConfig
	Tree      tree.Config
	// Version is the agent's version, as built.
	Version string
	// lock is the root's lock (Host.LockRoot), held while the agent runs;
	// nil when none was taken.
	lock io.Closer
	// Env is the environment the config was built from (standalone's and a
	// VM's are layered on the process's): its Reads are what the start read.
	Env *Reader
	// GOGC is GOGC as the operator set it (even empty); nil: the agent
	// sets its own GC target (cmd's memory.go).
	GOGC *string
	// MemoryLimitRatio is the share of its cgroup's memory limit the agent
	// sets as Go's soft memory limit, as Istio's agent does (it imports
	// automemlimit: AUTOMEMLIMIT, default 0.9); 0: none (AUTOMEMLIMIT=off,
	// or GOMEMLIMIT set: Go's runtime applies that itself). #36.
	MemoryLimitRatio float64
}

// Release drops the root's lock: at exit, or when the run stops before
// the tree starts (in-process tests run many commands on one root).
func (c *Agent) Release() {
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
	provCert    string // PROV_CERT: the CA's and istiod's roots, and the client certificate to both (certs, xdsproxy)
	outputCerts string // OUTPUT_CERTS: where certs writes, what proxyless gRPC reads
	istiodSAN   string // ISTIOD_SAN: istiod's name, as the CA and as the control plane
	clusterID   string // ISTIO_META_CLUSTER_ID: in CSRs and xDS requests
	// workloadSocketFile is WORKLOAD_IDENTITY_SOCKET_FILE: the SDS socket's
	// name, which Envoy's bootstrap names too.
	workloadSocketFile string
}

func readSharedVars(r envReader) sharedVars {
	return sharedVars{
		provCert:           envVar(r, "PROV_CERT", "", ParseString),
		outputCerts:        envVar(r, "OUTPUT_CERTS", "", ParseString),
		istiodSAN:          envVar(r, "ISTIOD_SAN", "", ParseString),
		clusterID:          envVar(r, "ISTIO_META_CLUSTER_ID", "", ParseString),
		workloadSocketFile: envVar(r, "WORKLOAD_IDENTITY_SOCKET_FILE", workloadSocketFile, ParseString),
	}
}

// memoryLimitRatio is automemlimit's rule, as Istio's pilot-agent applies
// it: nothing when GOMEMLIMIT is set (even empty), else AUTOMEMLIMIT, a
// ratio in (0, 1] or "off", 0.9 when unset.
func memoryLimitRatio(r envReader) float64 {
	if _, ok := r.env.Lookup("GOMEMLIMIT"); ok {
		return 0
	}
	return envVar(r, "AUTOMEMLIMIT", defaultMemoryLimitRatio, parseMemoryLimitRatio)
}

const defaultMemoryLimitRatio = 0.9

func parseMemoryLimitRatio(s string) (float64, error) {
	if strings.TrimSpace(s) == "off" {
		return 0, nil
	}
	f, err := ParseFloat(s)
	if err != nil || !(f > 0 && f <= 1) {
		return 0, errors.New(`want a ratio in (0, 1], or "off"`)
	}
	return f, nil
}

// Build turns the inputs into every service's config. Every bad value it
// finds — of a flag, a variable, a file — is in the error, each naming where
// it came from and the value. The services' configs are not validated here:
// their New does that, once, when cmd builds the tree (#26: each was
// checked here and again in New).
func Build(in Inputs) (*Agent, error) {
	p := in.Problems
	if p == nil {
		p = &Problems{}
	}
	r := envReader{env: in.Host.Env, problems: p}
	f := in.Flags
	c := &Agent{ProxyType: "sidecar", Root: CheckRoot(f.Root, p), Env: in.Host.Env, Version: in.Version}
	if v, ok := in.Host.Env.Lookup("GOGC"); ok {
		c.GOGC = &v
	}
	c.MemoryLimitRatio = memoryLimitRatio(r)
	if len(in.Args) > 0 {
		c.ProxyType = in.Args[0]
	}
	switch {
	case len(in.Args) > 1:
		p.Addf("proxy: %q: want at most one argument, the proxy type", in.Args)
	case c.ProxyType != "sidecar" && c.ProxyType != "router" && c.ProxyType != "waypoint":
		p.Addf("proxy: unknown proxy type %s: want sidecar, router or waypoint", QuoteValue(c.ProxyType))
		// Reported once: the rest of the build goes on as a sidecar, so
		// that the bootstrap's check does not say it again (#21).
		c.ProxyType = "sidecar"
	}
	if _, err := ParseLogLevel(in.LogLevel); err != nil {
		p.Add(err)
	}
	if f.stsPort != 0 {
		p.Addf("--stsPort %d: meshagent has no STS server; only 0 is supported", f.stsPort)
	}
	if f.restartMaxDelay < 100*time.Millisecond {
		p.Addf("--restart-max-delay %s: must be at least 100ms (the first restart's delay)", f.restartMaxDelay)
	}
	if f.envoyRestartWindow <= 0 {
		p.Addf("--envoy-restart-window %s: must be positive", f.envoyRestartWindow)
	}
	if c.Root == "" {
		return nil, p.Err() // nothing under it can be read
	}

	pod := podConfig(r, f, in.Host)
	meshFile := MeshConfigFile
	if f.meshConfig != nil {
		meshFile = *f.meshConfig
	}
	pcSources := proxyConfigSources{
		injected:        in.standalone.proxyConfigLayer(),
		meshConfigFile:  Rooted(c.Root, meshFile),
		meshConfigFlag:  f.meshConfig,
		proxyConfigEnv:  envVar(r, "PROXY_CONFIG", "", ParseString),
		annotationsFile: Rooted(c.Root, podAnnotationsFile),
	}
	pc, err := effectiveProxyConfig(r, pcSources, f.concurrency, in.Log)
	if err != nil {
		p.Add(err)
		return nil, p.Err() // every service's config depends on it
	}
	c.Proxy = pc
	// Before anything looks at the sockets under the root: a second agent
	// would take the first one's SDS socket for an external SDS server.
	if in.Host.LockRoot != nil {
		lock, err := in.Host.LockRoot(Rooted(c.Root, pc.ConfigPath))
		switch {
		case errors.Is(err, ErrRootLocked):
			p.Addf("--root %s: %w; stop it, or give this agent a --root of its own", c.Root, err)
			return nil, p.Err()
		case err != nil:
			// A configPath the agent cannot write fails later with its
			// own message (the bootstrap, the XDS socket).
			in.Log.Warn("cannot take the one-agent-per-root lock; a second agent on this root would not be detected", "error", err)
		}
		c.lock = lock
	}

	dns := dnsConfig(r, f, pod, c.ProxyType)
	shared := readSharedVars(r)
	certsCfg, sdsCfg := identityConfig(r, in.Host, c.Root, pod, shared, pc)
	sdsSocket := Rooted(c.Root, workloadIdentityDir+"/"+workloadSocketFile)
	filesSDSSocket := ""
	if sdsCfg != nil {
		sdsSocket = sdsCfg.EnvoySocketPath()
		if certsCfg == nil { // an external SDS server serves the identity: ours, files only
			filesSDSSocket = sdsCfg.FilesSocketPath
		}
	}
	envoyIn := envoyInputs{host: in.Host, root: c.Root, proxyType: c.ProxyType, flags: f, logAsJSON: in.LogAsJSON, version: in.Version,
		pod: pod, proxy: pc, dns: dns, shared: shared, euid: in.Host.EUID, runAs: in.EnvoyRunAs, sdsSocket: sdsSocket, filesSDSSocket: filesSDSSocket,
		lookPath: in.Host.LookPath}
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
	c.Tree = tree.Config{
		Certs:   certsCfg,
		SDS:     sdsCfg,
		Envoy:   envoyCfg,
		Capture: captureConfig(r, f, in.Host, in.Log),
		XDS: xdsConfig(r, xdsInputs{host: in.Host, root: c.Root, proxy: pc, envoyBootstrap: bootstrap, certs: certsCfg, shared: shared,
			nds: dns.enabled() && f.nameTable == "", envoyUID: envoyUID, envoyGID: envoyGID}),
		DNS: dns.proxy,
	}
	if f.nameTable != "" {
		c.Tree.NameTable = &nametable.Config{File: f.nameTable}
	}
	if in.NoCapture {
		c.Tree.Capture = nil
	}
	c.Tree.Status = statusConfig(r, statusInputs{proxyType: c.ProxyType, flags: f, instanceIP: pod.instanceIP, proxy: pc, envoy: c.Tree.Envoy, gatherer: in.Gatherer})
	c.Tree.ControlPlane, c.Tree.CA = in.standalone.peers(c.Root, certsCfg)
	treePolicies(&c.Tree, f, pc)
	if err := p.Err(); err != nil {
		c.Release()
		return nil, err
	}
	return c, nil
}

// CheckRoot returns --root (MESHAGENT_ROOT) as an absolute path to a
// directory, or "" after reporting why it is not one.
func CheckRoot(root string, p *Problems) string {
	abs, err := filepath.Abs(root)
	if err != nil {
		p.Addf("--root %s: %v", QuoteValue(root), err)
		return ""
	}
	switch st, err := os.Stat(abs); {
	case errors.Is(err, fs.ErrNotExist):
		p.Addf("--root %s: %s does not exist", QuoteValue(root), abs)
	case err != nil:
		p.Addf("--root %s: %v", QuoteValue(root), err)
	case !st.IsDir():
		p.Addf("--root %s: %s is not a directory", QuoteValue(root), abs)
	default:
		return abs
	}
	return ""
}

// podConfig is the workload's identity from Istio's environment, and its
// IPs: INSTANCE_IP first, then the host's private addresses (Istio's
// getDNSDomain and IP discovery).
func podConfig(r envReader, f *ProxyFlags, host Host) podInfo {
	pod := podInfo{
		name:           envVar(r, "POD_NAME", "", ParseString),
		namespace:      envVar(r, "POD_NAMESPACE", "", ParseDNSLabel),
		serviceAccount: envVar(r, "SERVICE_ACCOUNT", "", ParseDNSSubdomain),
		domain:         f.domain,
	}
	if pod.domain == "" {
		pod.domain = pod.namespace + ".svc.cluster.local"
	}
	if v, ok := r.env.Text("INSTANCE_IP"); ok {
		for i, s := range strings.Split(v, ",") {
			ip, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil {
				r.problems.Addf("INSTANCE_IP=%s: %s is not an IP address", QuoteValue(v), QuoteValue(s))
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
func appendHostIPs(ips []string, host Host, p *Problems) []string {
	var found []string
	if host.InterfaceAddrs != nil {
		addrs, err := host.InterfaceAddrs()
		if err != nil {
			p.Addf("listing the host's addresses: %v", err)
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
func treePolicies(tc *tree.Config, f *ProxyFlags, pc *meshconfig.ProxyConfig) {
	tc.DefaultPolicy, tc.EnvoyPolicy = tree.DefaultPolicy(), tree.DefaultPolicy()
	tc.DefaultPolicy.MaxDelay, tc.EnvoyPolicy.MaxDelay = f.restartMaxDelay, f.restartMaxDelay
	tc.EnvoyPolicy.GiveUp = &tree.GiveUp{Restarts: f.envoyRestarts, Window: f.envoyRestartWindow}
	drain := pc.GetTerminationDrainDuration().AsDuration()
	tc.DrainTimeout = drain + drainStopMargin
	tc.StopTimeout = max(serviceStopTimeout, drain+envoyStopMargin)
}

// ErrRootLocked: another agent holds the root's lock.
var ErrRootLocked = errors.New("another agent runs on this root")
