package config

import (
	"errors"
	"hash/fnv"
	"log/slog"
	"slices"
	"time"

	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/services/envoy/bootstrap"
)

// hotRestartConfig is the envoy service's hot restart (--hot-restart,
// MESHAGENT_HOT_RESTART; #25): the files Envoy's bootstrap is made from,
// and Reload, which runs the same translation as the start (ProxyConfig
// from its sources, then envoyConfig) on the files as they are now.
func hotRestartConfig(src proxyConfigSources, envoyIn envoyInputs, cfg *envoy.Config, log *slog.Logger) *envoy.HotRestartConfig {
	parent := envoy.DefaultParentShutdownDuration
	if drain := cfg.Args.DrainDuration; drain >= parent {
		// The old epoch must outlive its drain (Istio's old values: drain
		// 45s, parent shutdown 60s).
		parent = drain + 15*time.Second
	}
	configPath := ""
	if cfg.Bootstrap != nil {
		configPath = cfg.Bootstrap.ConfigPath
	}
	hr := &envoy.HotRestartConfig{
		BaseID:                 HotRestartBaseID(configPath),
		ParentShutdownDuration: parent,
		Watch:                  hotRestartInputs(src, cfg.Bootstrap),
	}
	hr.Reload = func() (envoy.Config, error) {
		p := &Problems{}
		r := envReader{env: envoyIn.host.Env, problems: p}
		pc, err := effectiveProxyConfig(r, src, envoyIn.flags.concurrency, log)
		if err != nil {
			return envoy.Config{}, err
		}
		ein := envoyIn
		ein.proxy = pc
		next, _ := envoyConfig(r, ein)
		if err := p.Err(); err != nil {
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

// HotRestartBaseID is Envoy's --base-id for the agent whose Envoy config
// path is configPath: stable across epochs and restarts of the agent, and
// different for two agents on one host (each has its own configPath under
// its own root), whose hot-restart sockets share the network namespace.
func HotRestartBaseID(configPath string) int {
	h := fnv.New32a()
	h.Write([]byte(configPath))
	// Envoy multiplies it by 10 (one slot per role and epoch) in 32 bits.
	return int(h.Sum32() % 100_000_000)
}
