package image

// The layout of Istio's proxyv2 image (pilot/docker/Dockerfile.proxyv2 and
// the injector's manifests/charts/istio-control/istio-discovery/files/
// injection-template.yaml), which an injected pod and Istio's tools rely on
// by path (#20). hack/mkimage lays out the stand-in base with the same names.
const (
	// AgentPath is Istio's ENTRYPOINT (ours: AgentEntrypoint); the injector's hooks exec "pilot-agent
	// wait" and "pilot-agent request ... POST drain" by name through PATH,
	// and its istio-init container runs "pilot-agent istio-iptables".
	AgentPath = "/usr/local/bin/pilot-agent"
	// AgentAlias is the same binary under our own name, so that a user who
	// types "meshagent" in the container finds it and its help says so.
	AgentAlias = "/usr/local/bin/meshagent"
	// InitPath is meshagent's small init, beside the agent where the agent
	// looks for it when it starts as PID 1 (cmd/meshagent-init, #24).
	InitPath = "/usr/local/bin/meshagent-init"
	// EnvoyPath is where both agents look for Envoy (ProxyConfig binaryPath).
	EnvoyPath = "/usr/local/bin/envoy"
	// TemplatePath is Istio's bootstrap template; Istio's agent needs it
	// (pkg/bootstrap DefaultCfgDir), meshagent renders it only when asked
	// (ISTIO_BOOTSTRAP, --templateFile) and otherwise has it built in.
	TemplatePath = "/var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
)

// AgentEntrypoint is the result's ENTRYPOINT where the base's is Istio's
// [AgentPath] (#36): the init, given the agent's path and the name it is
// called by (meshagent-init AGENT ARGV0 [ARG...]); the kubelet appends the
// container's args (Istio's injector: proxy sidecar, proxy router,
// istio-iptables).
var AgentEntrypoint = []string{InitPath, AgentPath, "pilot-agent"}

// InitName is the init's file name, looked for beside each agent binary, as
// the agent itself looks for it beside itself (cmd/meshagent/reaper.go).
const InitName = "meshagent-init"

// shape is what a base must hold to be proxyv2: each path with what it is,
// for the error that names what is missing.
var shape = []struct{ path, what string }{
	{EnvoyPath, "Envoy"},
	{AgentPath, "Istio's pilot-agent"},
	{TemplatePath, "Istio's bootstrap template"},
}

// Labels the result carries, beside the base's own (#32).
const (
	// LabelVersion is meshagent's version, as `meshagent version` prints it.
	LabelVersion = "io.meshagent.version"
	// LabelIstioVersion is the base's Istio version, from its labels or
	// environment or, failing those, its tag ("unknown" without any).
	LabelIstioVersion = "io.meshagent.base.istio-version"
	// LabelBase is the base as it was given, with its digest.
	LabelBase = "io.meshagent.base"
	// LabelAgent says which agent runs as pilot-agent (the kube suite and
	// `make image-istio` set "istio pilot-agent ..." for the oracle).
	LabelAgent = "io.meshagent.agent"
)
