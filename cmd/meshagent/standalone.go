package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
)

// newStandaloneCommand is `meshagent standalone`: `proxy`'s whole tree, in
// its production shape, plus an embedded control plane and CA in the same
// process, so that the agent does its real job on a machine with no
// cluster (config/standaloneconfig.go says how they are wired).
func newStandaloneCommand(cli *cliContext, logs *logOptions) *cobra.Command {
	f, sf := &config.ProxyFlags{}, &config.StandaloneFlags{}
	cmd := &cobra.Command{
		Use:   "standalone --mesh FILE",
		Short: "Runs the agent with an embedded control plane and CA: a whole sidecar on one machine, no cluster",
		Long: `Runs the agent exactly as 'proxy' does (same tree, flags and variables), plus two peers in
the same process, started and stopped by the tree (group "peers" in /debug/tree):

  controlplane  xDS (listeners, clusters, routes, endpoints) and Istio's NDS name table from --mesh,
                reloaded when the file changes; the agent's discoveryAddress (plaintext)
  ca            Istio's IstioCertificateService over TLS, signing the agent's CSR with a root kept
                under --root; the agent's CA_ADDR and CA_ROOT_CA

The agent runs as an injected pod would: POD_NAME=standalone-0, POD_NAMESPACE=default,
SERVICE_ACCOUNT=default, INSTANCE_IP=127.0.0.1, ISTIO_META_DNS_CAPTURE=true (the DNS proxy forwards
what the mesh does not know to --resolv-conf). Anything you set yourself wins: flags, then your
environment (PROXY_CONFIG, POD_NAME, CA_ADDR, ...) and files under --root, then these.

Envoy is ProxyConfig's binaryPath if set, else Istio's /usr/local/bin/envoy, else envoy on PATH,
else the stand-in 'fakeenvoy' beside this binary (make run builds it); the log says which.`,
		Args: cobra.NoArgs,
	}
	s := config.NewSettings(cmd.Flags())
	config.BindProxyFlags(s, f)
	config.BindStandaloneFlags(s, sf)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		log := startRun(s, cli.host.Env, *logs, cmd.ErrOrStderr())
		reg := prometheus.NewRegistry()
		selfDir := ""
		if self, err := os.Executable(); err == nil {
			selfDir = filepath.Dir(self)
		}
		plan, envoy, err := config.BuildStandalone(config.StandaloneInputs{
			Inputs: config.Inputs{Flags: f, LogLevel: logs.outputLevel, LogAsJSON: logs.asJSON, Version: currentVersion().Version, Host: cli.host, Problems: s.Problems, Log: log},
			Flags:  sf, LookPath: exec.LookPath, SelfDir: selfDir,
		})
		if err != nil {
			return &exitError{code: 2, err: err}
		}
		defer plan.Release()
		if err := writeStandaloneToken(config.Rooted(plan.Root, config.TokenFile)); err != nil {
			return err
		}
		log.Info("envoy binary", "path", envoy.Path, "why", envoy.Why)
		return cli.start(plan, reg, log)
	}
	return cmd
}

// writeStandaloneToken writes the token the agent sends the CA and the
// control plane, as Kubernetes mounts one into a pod, unless there is one.
// The embedded peers accept any token: it is there so that the agent runs
// its real client path, header included.
func writeStandaloneToken(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("token file: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	if err := os.WriteFile(path, []byte(config.StandaloneToken), 0o600); err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	return nil
}
