package config

// What `meshagent standalone` adds to the agent's configuration: the two
// embedded peers a pod would find in its cluster (services/controlplane for
// istiod's xDS, services/ca for istiod's CA), and the settings Istio's
// sidecar injector would give a pod so that the agent uses them. It goes
// through the same Build as `proxy`, as one more input, never a
// second pipeline. Precedence, highest first:
//
//	flags                                   (--root, --chaos, --resolv-conf, ... and standalone's own)
//	the user's environment and files        (PROXY_CONFIG, POD_NAME, CA_ADDR, ..., the mesh config file under --root)
//	standalone's settings                   (standaloneEnv; the ProxyConfig layer: discoveryAddress,
//	                                         controlPlaneAuthPolicy NONE, binaryPath)
//	Istio's defaults                        (istio.go)
//
// so that, as in a pod, whatever the user sets explicitly wins over what
// the injector set: PROXY_CONFIG='{"statusPort":25020}' moves a port and
// keeps the wiring to the peers; CA_ADDR=elsewhere sends the CSR elsewhere.

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/meshagent/meshagent/services/ca"
	"github.com/meshagent/meshagent/services/certs"
	"github.com/meshagent/meshagent/services/controlplane"
)

// Standalone's own paths and defaults. The CA's root lives under --root
// like every agent file; the agent trusts it through CA_ROOT_CA.
const (
	standaloneCADir       = "./var/lib/meshagent/ca"
	StandaloneToken       = "meshagent-standalone\n"
	standaloneEnvoyName   = "envoy"
	standaloneStandInName = "fakeenvoy" // the stand-in Envoy, as `make run` builds it next to meshagent
)

// StandaloneFlags are `standalone`'s flags besides `proxy`'s.
type StandaloneFlags struct {
	mesh               string
	certLifetime       time.Duration
	controlPlaneListen string
	caListen           string
}

func BindStandaloneFlags(s *Settings, f *StandaloneFlags) {
	// --mesh has no default: a path relative to wherever the command runs
	// would find the sample only from the source tree, and fail elsewhere
	// with a confusing "no such file". `make run` passes the sample.
	envFlagVar(s, &f.mesh, flagSpec{name: "mesh",
		usage: "Mesh YAML the embedded control plane serves (required; a sample: testdata/standalone/mesh.yaml), reloaded when it changes"}, envMeshagentMesh)
	envFlagVar(s, &f.certLifetime, flagSpec{name: "cert-lifetime",
		usage: "Lifetime of the workload certificates the embedded CA signs; the agent renews at half of it"}, envMeshagentCertLifetime)
	envFlagVar(s, &f.controlPlaneListen, flagSpec{name: "controlplane-listen",
		usage: "Loopback address of the embedded control plane (plaintext xDS, NDS); the agent's discoveryAddress"}, envMeshagentControlplaneListen)
	envFlagVar(s, &f.caListen, flagSpec{name: "ca-listen",
		usage: "Loopback address of the embedded CA (Istio's IstioCertificateService over TLS); the agent's CA_ADDR"}, envMeshagentCAListen)
}

// standaloneEnv is what an injector would put in the pod's environment:
// the workload's identity, the CA and its root, DNS capture. The user's
// environment wins over each of them.
func standaloneEnv(f *StandaloneFlags) map[string]string {
	return map[string]string{
		"POD_NAME":               "standalone-0",
		"POD_NAMESPACE":          "default",
		"SERVICE_ACCOUNT":        "default",
		"INSTANCE_IP":            "127.0.0.1",
		"CA_ADDR":                f.caListen,
		"CA_ROOT_CA":             filepath.Join(standaloneCADir, ca.RootCertFile), // under --root, as every CA_ROOT_CA
		"ISTIO_META_DNS_CAPTURE": "true",
	}
}

// standaloneLayer is standalone's part of Build's inputs. Its
// methods are nil-safe: `proxy` has none.
type standaloneLayer struct {
	// proxyConfig lies under the user's ProxyConfig layers.
	proxyConfig  string
	meshFile     string
	certLifetime time.Duration
	cpListen     string
	caListen     string
}

func (l *standaloneLayer) proxyConfigLayer() string {
	if l == nil {
		return ""
	}
	return l.proxyConfig
}

// peers are the embedded control plane and CA; the CA keeps its root under
// root and signs for the agent's trust domain (TRUST_DOMAIN).
func (l *standaloneLayer) peers(root, trustDomain string) (*controlplane.Config, *ca.Config) {
	if l == nil {
		return nil, nil
	}
	var cpc *controlplane.Config
	if l.meshFile != "" { // else --mesh was refused, and said so once (#21)
		cp := controlplane.NewConfig(l.cpListen, l.meshFile)
		cpc = &cp
	}
	c := ca.NewConfig(l.caListen, Rooted(root, standaloneCADir), l.certLifetime, trustDomain)
	return cpc, &c
}

// StandaloneInputs are everything a `standalone` run is configured from:
// proxy's inputs, standalone's flags, and where Envoy may be found.
type StandaloneInputs struct {
	Inputs Inputs
	Flags  *StandaloneFlags
	// LookPath is exec.LookPath (tests give their own).
	LookPath func(string) (string, error)
	// SelfDir is the directory of the running meshagent binary, where
	// `make run` builds the stand-in Envoy.
	SelfDir string
}

// EnvoyChoice is the Envoy standalone runs, and why: said once in the log.
type EnvoyChoice struct {
	Path, Why string
}

// BuildStandalone is Build with standalone's settings and
// peers, then the checks that the agent really uses them.
func BuildStandalone(in StandaloneInputs) (*Plan, EnvoyChoice, error) {
	p := in.Inputs.Problems
	if p == nil {
		p = &Problems{}
	}
	f := in.Flags
	layer := &standaloneLayer{meshFile: meshFile(f.mesh, p), certLifetime: f.certLifetime, cpListen: f.controlPlaneListen, caListen: f.caListen}
	if f.certLifetime <= 0 {
		p.addf("--cert-lifetime %s: must be positive", f.certLifetime)
	}
	envoy := findEnvoy(in.LookPath, in.SelfDir)
	pcLayer := map[string]any{"discoveryAddress": f.controlPlaneListen, "controlPlaneAuthPolicy": "NONE"}
	if envoy.Path != "" {
		pcLayer["binaryPath"] = envoy.Path
	}
	js, err := json.Marshal(pcLayer)
	if err != nil {
		return nil, EnvoyChoice{}, err
	}
	layer.proxyConfig = string(js)

	ai := in.Inputs
	ai.Problems = p
	ai.standalone = layer
	ai.Host.Env = withDefaults(ai.Host.Env, standaloneEnv(f))
	// Standalone finds its Envoy and says why it has none (below); the
	// generic check would name only Istio's path.
	lookPath := ai.Host.LookPath
	ai.Host.LookPath = nil
	cfg, err := Build(ai)
	if err != nil {
		return nil, EnvoyChoice{}, err
	}

	if c := cfg.Tree.Certs; c == nil || c.Source != certs.SourceCA || c.Roots != certs.RootsWithCertificate {
		p.addf("standalone: the agent's certificate must come from the embedded CA, but %s", whyNotCA(c, cfg.Root))
	}
	switch {
	case envoy.Path != "" && cfg.Proxy.BinaryPath == envoy.Path: // ours
	case envoy.Path == "" && cfg.Proxy.BinaryPath == envoyBinaryPath:
		p.addf("standalone: no Envoy to run: %s; install envoy, or build the stand-in with `make fakeenvoy`", envoy.Why)
	default:
		envoy = EnvoyChoice{Path: cfg.Proxy.BinaryPath, Why: "binaryPath is set in the configuration (PROXY_CONFIG, the mesh config file or an annotation)"}
		if lookPath != nil && cfg.Tree.Envoy != nil {
			checkEnvoyBinary(p, cfg.Proxy.BinaryPath, lookPath)
		}
	}
	if err := p.Err(); err != nil {
		cfg.Release()
		return nil, EnvoyChoice{}, err
	}
	return cfg, envoy, nil
}

// meshFile is --mesh as an absolute path, after reporting why it is not a
// file if it is not one. Its content is the control plane's to judge: a bad
// file is reported by its health and fixed while the agent runs.
func meshFile(path string, p *Problems) string {
	if path == "" {
		p.addf("--mesh (MESHAGENT_MESH) is required: the mesh YAML the embedded control plane serves (a sample is testdata/standalone/mesh.yaml in meshagent's source)")
		return ""
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		p.addf("--mesh %s: %v", quoteValue(path), err)
		return ""
	}
	if st, err := os.Stat(abs); err != nil {
		p.addf("--mesh %s: %v", quoteValue(path), err)
	} else if !st.Mode().IsRegular() {
		p.addf("--mesh %s: not a regular file", quoteValue(path))
	}
	return abs
}

// findEnvoy is the Envoy standalone runs unless the configuration names
// one: Istio's binaryPath if it is installed there, else `envoy` on PATH,
// else the stand-in beside this binary; path is "" when there is none.
func findEnvoy(lookPath func(string) (string, error), selfDir string) EnvoyChoice {
	if p, err := lookPath(envoyBinaryPath); err == nil {
		return EnvoyChoice{Path: p, Why: "Istio's binaryPath " + envoyBinaryPath + " is installed"}
	}
	if p, err := lookPath(standaloneEnvoyName); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		return EnvoyChoice{Path: p, Why: "envoy found on PATH (none at " + envoyBinaryPath + ")"}
	}
	none := "no envoy at " + envoyBinaryPath + " nor on PATH"
	if selfDir != "" {
		standIn := filepath.Join(selfDir, standaloneStandInName)
		if p, err := lookPath(standIn); err == nil {
			return EnvoyChoice{Path: p, Why: none + ": running the stand-in Envoy (testdata/fakeenvoy), a test tool that " +
				"speaks xDS and SDS and serves the admin API, /config_dump included, and relays captured TCP to its original " +
				"destination (no TLS, routing or load balancing)"}
		}
		none += ", no stand-in at " + standIn
	}
	return EnvoyChoice{Why: none}
}

// whyNotCA says why the agent's certificate would not come from the CA.
func whyNotCA(c *certs.Config, root string) string {
	if c == nil {
		return "the certificate provider is off (PILOT_CERT_PROVIDER=none, or an external SDS server answers on its socket)"
	}
	return fmt.Sprintf("file-mounted certificates under --root would be used (source %s, roots %s): remove %s and %s",
		c.Source, c.Roots, Rooted(root, etcCertsDir), Rooted(root, workloadCredsDir))
}

// withDefaults is env with defaults for the variables it does not set (an
// empty value counts as unset, as everywhere): a new reader over env's
// source, so that the configuration's reads are counted once, on it.
func withDefaults(env *Reader, defaults map[string]string) *Reader {
	src := env.source()
	return NewReader(Environment{
		Lookup: func(name string) (string, bool) {
			if v, ok := src.Get(name); ok {
				return v, true
			}
			v, ok := defaults[name]
			return v, ok
		},
		List: func() []string {
			var out []string
			for _, kv := range src.All() {
				name, _, _ := strings.Cut(kv, "=")
				if _, set := src.Get(name); set || defaults[name] == "" {
					out = append(out, kv)
				}
			}
			for _, name := range slices.Sorted(maps.Keys(defaults)) {
				if _, set := src.Get(name); !set {
					out = append(out, name+"="+defaults[name])
				}
			}
			return out
		},
	})
}
