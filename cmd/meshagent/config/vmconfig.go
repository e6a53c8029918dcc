package config

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
)

// VMFlags are what `vm` adds to `proxy`'s flags: where the bundle's files are.
type VMFlags struct {
	clusterEnv, sidecarEnv string
}

func BindVMFlags(s *Settings, f *VMFlags) {
	envFlagVar(s, &f.clusterEnv, flagSpec{name: "cluster-env", usage: "The VM bundle's cluster.env (under --root); required"}, envIstioClusterConfig)
	envFlagVar(s, &f.sidecarEnv, flagSpec{name: "sidecar-env", usage: "Local settings read before cluster.env (under --root); optional"}, envIstioSidecarConfig)
}

// vmEnvironment is the environment istio-start.sh gives pilot-agent: the
// process's, then sidecar.env's, then cluster.env's variables (sourced
// with set -a: the files win), then the script's defaults for what is
// still unset. A missing cluster.env is an error naming it (the script
// would go on without it and run a sidecar for namespace "default").
func vmEnvironment(root string, f *VMFlags, host Host, p *Problems) (*Reader, error) {
	vars := map[string]string{}
	for _, kv := range host.Env.source().All() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	sidecar, err := readOptionalEnvFile(Rooted(root, f.sidecarEnv))
	if err != nil {
		return nil, fmt.Errorf("sidecar.env: %w", err)
	}
	cluster, err := readEnvFile(Rooted(root, f.clusterEnv))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("cluster.env: %s does not exist (--cluster-env, ISTIO_CLUSTER_CONFIG): "+
			"copy the VM bundle's cluster.env there (istioctl x workload entry configure)", Rooted(root, f.clusterEnv))
	}
	if err != nil {
		return nil, fmt.Errorf("cluster.env: %w", err)
	}
	for _, file := range []map[string]string{sidecar, cluster} {
		for k, v := range file {
			vars[k] = v
		}
	}
	vmDefaults(vars, host, p)
	return MapEnvironment(vars), nil
}

// vmDefaults sets what istio-start.sh derives, where vars leave it unset.
// The script's own variables are read through the table (their defaults
// are its; a bad value goes to p); the agent's are set in vars where unset.
func vmDefaults(vars map[string]string, host Host, p *Problems) {
	r := envReader{env: MapEnvironment(vars), problems: p}
	setDefault := func(k, v string) {
		if vars[k] == "" {
			vars[k] = v
		}
	}

	// The script starts pilot-agent with POD_NAMESPACE=${ISTIO_NAMESPACE:-default}.
	if ns, ok := lookup(r, envIstioNamespace); ok || vars["POD_NAMESPACE"] == "" {
		vars["POD_NAMESPACE"] = ns
	}
	if ip := get(r, envIstioSVCIP); ip != "" {
		vars["INSTANCE_IP"] = ip
	} // else the host's addresses, as the script's `hostname --all-ip-addresses`
	if vars["POD_NAME"] == "" && host.Hostname != nil {
		if name, err := host.Hostname(); err == nil {
			// hostname -s, lowercased: a host name is case-blind, a pod
			// name (POD_NAME, checked as one) lowercase.
			short, _, _ := strings.Cut(name, ".")
			vars["POD_NAME"] = strings.ToLower(short)
		}
	}
	// CA_ADDR > PILOT_ADDRESS > ISTIO_PILOT_PORT > istiod's default.
	systemNS := get(r, envIstioSystemNamespace)
	pilot := get(r, envPilotAddress)
	if port := get(r, envIstioPilotPort); pilot == "" && port != 0 {
		pilot = "istiod." + systemNS + ".svc:" + strconv.Itoa(port)
	}
	if pilot != "" {
		setDefault("CA_ADDR", pilot)
	}
	setDefault("CA_ADDR", "istiod."+systemNS+".svc:15012")
	setDefault("PROV_CERT", VMCertsDir)
	setDefault("OUTPUT_CERTS", VMCertsDir)
	if vars["PROXY_CONFIG"] == "" {
		pc := fmt.Sprintf("serviceCluster: %s\ncontrolPlaneAuthPolicy: %s\n", get(r, envIstioService), get(r, envIstioCPAuth))
		if pilot != "" {
			pc += "discoveryAddress: " + pilot + "\n"
		}
		vars["PROXY_CONFIG"] = pc
	}
}

// VM is what `meshagent vm` reads besides proxy's configuration: the
// environment istio-start.sh would give the agent, and whether the operator
// owns iptables.
type VM struct {
	// Env is the process environment under sidecar.env's and cluster.env's
	// variables and the script's defaults: the environment of every read
	// that follows (the agent's configuration, the capture settings).
	Env *Reader
	// ClusterEnv is the cluster.env read, under --root.
	ClusterEnv string
	// CustomIPTables is ISTIO_CUSTOM_IP_TABLES: the operator programs
	// iptables, the agent leaves them alone.
	CustomIPTables bool
}

// ReadVM reads the VM bundle's files under root; bad values of the
// variables it reads go to p.
func ReadVM(root string, f *VMFlags, host Host, p *Problems) (VM, error) {
	env, err := vmEnvironment(root, f, host, p)
	if err != nil {
		return VM{}, err
	}
	r := envReader{env: env, problems: p}
	return VM{Env: env, ClusterEnv: Rooted(root, f.clusterEnv),
		CustomIPTables: get(r, envIstioCustomIPTables)}, nil
}
