package main

import (
	"errors"
	"hash/fnv"
	"slices"
	"time"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/services/envoy/bootstrap"
)

// hotRestartConfig is the envoy service's hot restart (--hot-restart,
// MESHAGENT_HOT_RESTART; #25): the files Envoy's bootstrap is made from,
// and Reload, which runs the same translation as the start (ProxyConfig
// from its sources, then envoyConfig) on the files as they are now.
func hotRestartConfig(in agentInputs, src proxyConfigSources, envoyIn envoyInputs, cfg *envoy.Config) *envoy.HotRestartConfig {
	parent := envoy.DefaultParentShutdownDuration
	if drain := cfg.Args.DrainDuration; drain >= parent {
		// The old epoch must outlive its drain (Istio's old values: drain
		// 45s, parent shutdown 60s).
		parent = drain + 15*time.Second
	}
	hr := &envoy.HotRestartConfig{
		BaseID:                 baseID(cfg.Bootstrap),
		ParentShutdownDuration: parent,
		Watch:                  hotRestartInputs(src, cfg.Bootstrap),
	}
	hr.Reload = func() (envoy.Config, error) {
		p := &problems{}
		r := envReader{env: in.host.env, problems: p}
		pc, err := loadProxyConfig(src, in.log)
		if err != nil {
			return envoy.Config{}, err
		}
		applyConcurrency(pc, optionalEnvVar(r, "ISTIO_CPU_LIMIT", config.ParseCount), in.flags.concurrency, in.log)
		if err := validateProxyConfig(pc); err != nil {
			return envoy.Config{}, err
		}
		ein := envoyIn
		ein.proxy = pc
		next, _ := envoyConfig(r, ein)
		if err := p.err(); err != nil {
			return envoy.Config{}, err
		}
		if next == nil {
			return envoy.Config{}, errors.New("DISABLE_ENVOY: no envoy")
		}
		next.HotRestart = &envoy.HotRestartConfig{Watch: hotRestartInputs(src, next.Bootstrap)}
		return *next, nil
	}
	return hr
}

// hotRestartInputs are the files a bootstrap is made from: the mesh config
// file and the pod's files, the template, the override; a custom config
// file is Envoy's bootstrap itself.
func hotRestartInputs(src proxyConfigSources, b *bootstrap.Config) []string {
	files := []string{src.meshConfigFile, src.annotationsFile}
	if b == nil {
		return files
	}
	files = append(files, b.LabelsFile, b.AnnotationsFile, b.IstioBootstrap, b.CustomConfigFile, b.TemplateFile, b.OverrideFile)
	if pc := b.Proxy; pc != nil {
		files = append(files, pc.GetProxyBootstrapTemplatePath(), pc.GetCustomConfigFile())
	}
	files = slices.DeleteFunc(files, func(f string) bool { return f == "" })
	slices.Sort(files)
	return slices.Compact(files)
}

// baseID is Envoy's --base-id for the agent: stable across epochs and
// restarts of the agent, and different for two agents on one host (each
// has its own configPath under its own root), whose hot-restart sockets
// share the network namespace.
func baseID(b *bootstrap.Config) int {
	h := fnv.New32a()
	if b != nil {
		h.Write([]byte(b.ConfigPath))
	}
	// Envoy multiplies it by 10 (one slot per role and epoch) in 32 bits.
	return int(h.Sum32() % 100_000_000)
}
