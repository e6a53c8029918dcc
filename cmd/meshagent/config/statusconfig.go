package config

import (
	"fmt"

	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/services/status"
	"github.com/meshagent/meshagent/services/status/appprobe"
	"github.com/meshagent/meshagent/services/status/metricsmerge"
)

// statusInputs are what the status server's config is built from besides
// the environment.
type statusInputs struct {
	proxyType string
	// instanceIP is the pod's IP the probes go to (podInfo.instanceIP).
	instanceIP string
	flags      *ProxyFlags
	proxy      *meshconfig.ProxyConfig
	// envoy is the envoy service's config, nil with DISABLE_ENVOY: Envoy's
	// metrics are merged from the port its bootstrap gives its Prometheus
	// listener (ENVOY_PROMETHEUS_PORT).
	envoy *envoy.Config
}

// statusConfig is the status server on ProxyConfig.statusPort (all
// interfaces, as Istio's), with the application's probes and the merged
// metrics from Istio's variables (pilot-agent's status.NewServer and
// options.NewStatusServerOptions); nil when the port is 0, and then, as in
// Istio, none of its variables is read.
func statusConfig(r envReader, in statusInputs) *status.Config {
	pc := in.proxy
	if pc.StatusPort == 0 {
		return nil
	}
	return &status.Config{
		Addr:      fmt.Sprintf(":%d", pc.StatusPort),
		Chaos:     in.flags.chaos,
		Profiling: in.flags.profiling,
		Probes:    probeConfig(r, pc, in.instanceIP),
		Metrics:   metricsConfig(r, in),
	}
}

// probeConfig is the rewriting of the application's probes kubelet sends
// to /app-health/... and /app-lifecycle/..., and the VM's readiness probe.
func probeConfig(r envReader, pc *meshconfig.ProxyConfig, instanceIP string) appprobe.Config {
	app, err := appprobe.ParseAppProbers(get(r, envIstioKubeAppProbers))
	r.problems.Add(err) // names the variable, and the probe's path
	workload, err := appprobe.NewWorkloadProbe(pc.GetReadinessProbe())
	r.problems.Add(err) // names ProxyConfig.readinessProbe
	host := instanceIP
	if get(r, envRewriteProbeLegacyLocalhostDestination) {
		host = "localhost"
	}
	return appprobe.Config{
		App:          app,
		Host:         host,
		DisableHTTP2: !get(r, envIstioEnableHTTP2Probing),
		KeepAlive:    get(r, envEnableProbeKeepaliveConnections),
		Workload:     workload,
	}
}

// metricsConfig is what /stats/prometheus merges after the agent's own
// metrics: Envoy's and the application's.
func metricsConfig(r envReader, in statusInputs) metricsmerge.Config {
	m := metricsmerge.Config{
		// The agent's endpoint; Envoy's :15090 listener reads the same name
		// from proxyMetadata (envoyConfig), as Istio's bootstrap does.
		LocalhostOnly: get(r, envMetricsLocalhostAccessOnly),
	}
	merge := get(r, envPilotAgentMergeEnvoyStats)
	if merge && in.envoy != nil && in.envoy.Bootstrap != nil {
		m.EnvoyPort = in.envoy.Bootstrap.EnvoyPrometheusPort
	}
	// Istio reads the application's scrape configuration for sidecars
	// only: 15020 is exposed in gateways' Services, and an application
	// endpoint there would be served to the world.
	annotations := get(r, envIstioPrometheusAnnotations)
	if in.proxyType == "sidecar" {
		app, err := metricsmerge.ParsePrometheusAnnotations(annotations, int(in.proxy.StatusPort), int(in.proxy.ProxyAdminPort))
		r.problems.Add(err) // names the variable
		m.App = app
	}
	return m
}
