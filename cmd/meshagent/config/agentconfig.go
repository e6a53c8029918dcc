package config

// The configuration pipeline of `proxy`, in one function: the flags, the
// environment, the host and the files under --root go in, every service's
// config comes out as one tree.Config, in a Plan.
//
//	flags ──► Settings (flag, else its variables, else the table's default; flagenv.go)
//	                │
//	environment ──► Reader (each variable once, through its entry in env.go; environment.go)
//	Host, files ──► Build
//	                │   ProxyConfig: Istio's defaults < (standalone's) < mesh file < PROXY_CONFIG < annotations (proxyconfig.go)
//	                │   the root's lock, one agent per root (Host.LockRoot: cmd's rootlock.go)
//	                │   pod, dns, identity, envoy, capture, status: one builder each (*config.go),
//	                │   reading the variables with get(r, envX); Istio's names and paths from istio.go
//	                ▼
//	Plan.Tree ──► (cmd) tree.Build: each service's New validates its config, the only check of it (#26)
//	          ──► ports tried (cmd's portcheck.go) ──► one info line, the detail at debug (effective.go) ──► run
//
// Every bad input stops the agent before it runs, exit 2, naming the flag,
// variable, file or port and the value (#21): never a run that fails
// later, or for a reason it does not name. The builders check what only
// they can name (a flag, a variable, a layer of the ProxyConfig); a
// service's own rules are its New's, and its errors name the variable too.
//
// A variable is added to the table (env.go: its default, parser, service,
// doc), read with get in the builder of the service that uses it, and
// mapped to a field of the service's Config.

import (
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

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

// Plan is what an agent will run, as the configuration resolved it: the
// tree's config (tree.Build turns it into a tree.Agent), what the start log
// shows besides it, and the root's lock held for the run. Not an agent
// itself: it was called Agent, and met tree.Agent in runAgent (#34).
type Plan struct {
	ProxyType string
	Root      string
	Proxy     *meshconfig.ProxyConfig
	Tree      tree.Config
	// Version is the agent's version, as built.
	Version string
	// lock is the root's lock (Host.LockRoot), held while the agent runs;
	// nil when none was taken.
	lock io.Closer
	// GCPercent is the GC target the agent sets (cmd's memory.go): GOGC's
	// default; nil when GOGC is set (even empty), which Go's runtime
	// applied itself.
	GCPercent *int
	// IdleMaxProcs is the parallelism the agent runs on while idle once it
	// is first ready (cmd's parallelism.go); 0: always the one Go's runtime
	// set at start (GOMAXPROCS, which Istio's injector sets from the CPU
	// limit, or the CPU limit itself).
	IdleMaxProcs int
	// MemoryLimitRatio is the share of its cgroup's memory limit the agent
	// sets as Go's soft memory limit, as Istio's agent does (it imports
	// automemlimit: AUTOMEMLIMIT, default 0.9); 0: none (AUTOMEMLIMIT=off,
	// or GOMEMLIMIT set: Go's runtime applies that itself). #36.
	MemoryLimitRatio float64
}

// Release drops the root's lock: at exit, or when the run stops before
// the tree starts (in-process tests run many commands on one root).
func (c *Plan) Release() {
	if c != nil && c.lock != nil {
		c.lock.Close()
		c.lock = nil
	}
}

// memoryLimitRatio is automemlimit's rule, as Istio's pilot-agent applies
// it: nothing when GOMEMLIMIT is set (even empty), else AUTOMEMLIMIT, a
// ratio in (0, 1] or "off" (0).
func memoryLimitRatio(r envReader) float64 {
	if present(r.env, envGOMEMLIMIT) {
		return 0
	}
	return get(r, envAUTOMEMLIMIT)
}

// Build turns the inputs into every service's config. Every bad value it
// finds — of a flag, a variable, a file — is in the error, each naming where
// it came from and the value. The services' configs are not validated here:
// their New does that, once, when cmd builds the tree (#26: each was
// checked here and again in New).
func Build(in Inputs) (*Plan, error) {
	p := in.Problems
	if p == nil {
		p = &Problems{}
	}
	r := envReader{env: in.Host.Env, problems: p}
	f := in.Flags
	c := &Plan{ProxyType: "sidecar", Root: CheckRoot(f.Root, p), Version: in.Version}
	if !present(in.Host.Env, envGOGC) {
		c.GCPercent = &envGOGC.Default
	}
	c.IdleMaxProcs = get(r, envIdleGOMAXPROCS)
	c.MemoryLimitRatio = memoryLimitRatio(r)
	if len(in.Args) > 0 {
		c.ProxyType = in.Args[0]
	}
	switch {
	case len(in.Args) > 1:
		p.addf("proxy: %q: want at most one argument, the proxy type", in.Args)
	case c.ProxyType != "sidecar" && c.ProxyType != "router" && c.ProxyType != "waypoint":
		p.addf("proxy: unknown proxy type %s: want sidecar, router or waypoint", quoteValue(c.ProxyType))
		// Reported once: the rest of the build goes on as a sidecar, so
		// that the bootstrap's check does not say it again (#21).
		c.ProxyType = "sidecar"
	}
	if _, err := ParseLogLevel(in.LogLevel); err != nil {
		p.Add(err)
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
		proxyConfigEnv:  get(r, envProxyConfig),
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
			p.addf("--root %s: %w; stop it, or give this agent a --root of its own", c.Root, err)
			return nil, p.Err()
		case err != nil:
			// A configPath the agent cannot write fails later with its
			// own message (the bootstrap, the XDS socket).
			in.Log.Warn("cannot take the one-agent-per-root lock; a second agent on this root would not be detected", "error", err)
		}
		c.lock = lock
	}

	dns := dnsConfig(r, f, pod, c.ProxyType)
	certsCfg, sdsCfg := identityConfig(r, in.Host, c.Root, pod, pc)
	sdsSocket := Rooted(c.Root, workloadIdentityDir+"/"+envWorkloadIdentitySocketFile.Default)
	filesSDSSocket := ""
	if sdsCfg != nil {
		sdsSocket = sdsCfg.EnvoySocketPath()
		if certsCfg == nil { // an external SDS server serves the identity: ours, files only
			filesSDSSocket = sdsCfg.FilesSocketPath
		}
	}
	envoyIn := envoyInputs{host: in.Host, root: c.Root, proxyType: c.ProxyType, flags: f, logAsJSON: in.LogAsJSON, version: in.Version,
		pod: pod, proxy: pc, dns: dns, euid: in.Host.EUID, runAs: in.EnvoyRunAs, sdsSocket: sdsSocket, filesSDSSocket: filesSDSSocket,
		lookPath: in.Host.LookPath}
	envoyCfg, bootstrap := envoyConfig(r, envoyIn)
	if f.hotRestart && envoyCfg != nil {
		envoyCfg.HotRestart = hotRestartConfig(pcSources, envoyIn, envoyCfg, in.Log)
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
		XDS: xdsConfig(r, xdsInputs{host: in.Host, root: c.Root, proxy: pc, envoyBootstrap: bootstrap, certs: certsCfg,
			nds: dns.enabled() && f.nameTable == "", envoyUID: envoyUID, envoyGID: envoyGID}),
		DNS: dns.proxy,
	}
	if f.nameTable != "" {
		c.Tree.NameTable = &nametable.Config{File: f.nameTable}
	}
	if in.NoCapture {
		c.Tree.Capture = nil
	}
	c.Tree.Status = statusConfig(r, statusInputs{proxyType: c.ProxyType, flags: f, instanceIP: pod.instanceIP, proxy: pc, envoy: c.Tree.Envoy})
	c.Tree.ControlPlane, c.Tree.CA = in.standalone.peers(c.Root, get(r, envTrustDomain))
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
		p.addf("--root %s: %v", quoteValue(root), err)
		return ""
	}
	switch st, err := os.Stat(abs); {
	case errors.Is(err, fs.ErrNotExist):
		p.addf("--root %s: %s does not exist", quoteValue(root), abs)
	case err != nil:
		p.addf("--root %s: %v", quoteValue(root), err)
	case !st.IsDir():
		p.addf("--root %s: %s is not a directory", quoteValue(root), abs)
	default:
		return abs
	}
	return ""
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
