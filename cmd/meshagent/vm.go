package main

// `meshagent vm` is Istio's VM onboarding (tools/packaging/common/
// istio-start.sh run by istio.service) in one process under systemd: read
// the bundle's cluster.env (and sidecar.env), derive what the script
// derives, own the iptables capture as root, and run Envoy as the proxy
// user. The script's steps and where they live here:
//
//	source sidecar.env, cluster.env (set -a)  vmEnvironment: files win over the process env
//	NS, SVC, CA_ADDR, PROV_CERT, PROXY_CONFIG  vmDefaults
//	istio-iptables --cleanup-only; istio-iptables   the capture service (VM mode): apply at start,
//	                                                reconcile, remove at stop; ISTIO_CUSTOM_IP_TABLES=true: none
//	sudo -u istio-proxy pilot-agent proxy      Envoy alone runs as the proxy user; the agent keeps
//	                                           root and takes the proxy group (vmProxyUser, dropToProxyGroup)
//	istio-start.sh clean                       `meshagent vm clean` (the unit's ExecStopPost)

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/services/envoy"
)

func newVMCommand(cli *cliContext, logs *logOptions) *cobra.Command {
	f, vf := &config.ProxyFlags{}, &config.VMFlags{}
	cmd := &cobra.Command{
		Use:   "vm [clean]",
		Short: "Runs the agent on a VM or bare-metal host, as Istio's istio-start.sh: cluster.env, capture as root, Envoy as istio-proxy",
		Long: `Runs the agent as Istio's VM onboarding runs pilot-agent (istio.service, istio-start.sh), in one
process under systemd (Type=notify): reads the bundle's cluster.env (and sidecar.env before it; the
files win over the environment), derives POD_NAMESPACE, POD_NAME, CA_ADDR, PROV_CERT, OUTPUT_CERTS
and PROXY_CONFIG as the script does, reads the mesh config from --meshConfig, the CA's root from
PROV_CERT/root-cert.pem and the token from ./var/run/secrets/tokens/istio-token, all under --root.

As root it applies the capture rules from the ISTIO_* settings, re-applies them every
--capture-check-interval if they were flushed or changed, and removes them when it stops
(ISTIO_CUSTOM_IP_TABLES=true: iptables is left alone). Envoy runs as the proxy user (uid of
$ENVOY_USER, default istio-proxy, else 1337; root with TPROXY, as Istio); the agent keeps root and
takes the proxy's group, so that its own connections to the CA and the control plane pass the capture
rules' --gid-owner exception.

'meshagent vm clean' removes the capture rules (the unit's ExecStopPost), unless ISTIO_CUSTOM_IP_TABLES=true.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 1 || len(args) == 1 && args[0] != "clean" {
				return usageError("vm: %q: the only argument is \"clean\"", args)
			}
			return nil
		},
	}
	s := config.NewSettings(cmd.Flags())
	config.BindProxyFlags(s, f)
	config.BindVMFlags(s, vf)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		log := startRun(s, cli.host.Env, *logs, cmd.ErrOrStderr())
		root := config.CheckRoot(f.Root, s.Problems)
		if root == "" {
			return &exitError{code: 2, err: s.Problems.Err()}
		}
		host := cli.host
		vm, err := config.ReadVM(root, vf, host, s.Problems)
		if err != nil {
			return &exitError{code: 2, err: err}
		}
		host.Env = vm.Env
		customIPTables := vm.CustomIPTables
		user, err := vmProxyUser(host)
		if err != nil {
			return &exitError{code: 2, err: err}
		}
		if len(args) == 1 {
			if err := s.Problems.Err(); err != nil {
				return &exitError{code: 2, err: err}
			}
			return vmClean(customIPTables, host, cmd, log)
		}
		if host.EUID != 0 {
			return fmt.Errorf("vm: must run as root: it owns the capture rules and starts Envoy as uid %d", user.UID)
		}
		f.Capture = !customIPTables
		reg := prometheus.NewRegistry()
		plan, err := config.Build(config.Inputs{Flags: f, LogLevel: logs.outputLevel, LogAsJSON: logs.asJSON, Version: currentVersion().Version, Host: host, Problems: s.Problems, Log: log,
			EnvoyRunAs: user.envoy, NoCapture: customIPTables})
		if err != nil {
			return &exitError{code: 2, err: err}
		}
		defer plan.Release()
		if err := prepareProxyDirs(plan, user); err != nil {
			return err
		}
		if err := dropToProxyGroup(user.GID); err != nil {
			return err
		}
		log.Info("vm mode", "cluster_env", vm.ClusterEnv, "capture", !customIPTables,
			"envoy_uid", user.envoyUID(), "agent_gid", user.GID)
		return cli.start(plan, reg, log)
	}
	return cmd
}

// proxyUser is who Envoy runs as, and the group the agent takes.
type proxyUser struct {
	UID, GID int
	// envoy is Envoy's credential; nil with TPROXY, where Envoy needs
	// CAP_NET_ADMIN for transparent sockets and Istio runs it as root.
	envoy *envoy.Credential
}

func (u proxyUser) envoyUID() int {
	if u.envoy == nil {
		return 0
	}
	return u.UID
}

// vmProxyUser is the proxy's uid and gid as the capture rules exempt them
// (istio-iptables' --proxy-uid/--proxy-gid defaults: the uid of
// $ENVOY_USER, default istio-proxy, else 1337; the first of a list), so
// that Envoy's traffic and the rules agree by construction.
func vmProxyUser(host config.Host) (proxyUser, error) {
	cfg, err := config.BindCaptureSettings(pflag.NewFlagSet("vm", pflag.ContinueOnError)).Config(host)
	if err != nil {
		return proxyUser{}, fmt.Errorf("capture settings: %w", err)
	}
	first := func(name, list string) (int, error) {
		s, _, _ := strings.Cut(list, ",")
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s %q: want a numeric id", name, list)
		}
		return n, nil
	}
	u := proxyUser{}
	if u.UID, err = first("proxy uid (PROXY_UID, $ENVOY_USER)", cfg.ProxyUID); err != nil {
		return u, err
	}
	if u.GID, err = first("proxy gid (PROXY_GID)", cfg.ProxyGID); err != nil {
		return u, err
	}
	if cfg.InboundInterceptionMode != "TPROXY" {
		u.envoy = &envoy.Credential{UID: uint32(u.UID), GID: uint32(u.GID)}
	}
	return u, nil
}

// prepareProxyDirs makes the directories Envoy reads from and connects
// through (the bootstrap and XDS socket's, the SDS socket's) traversable
// by the proxy's group and nobody else: root:<gid> 0750. The sockets
// themselves are chowned by their services. Istio's VM package does the
// same with chown -R istio-proxy at install time.
func prepareProxyDirs(plan *config.Plan, u proxyUser) error {
	if u.envoy == nil {
		return nil
	}
	dirs := []string{config.Rooted(plan.Root, plan.Proxy.GetConfigPath())}
	if plan.Tree.XDS != nil {
		dirs = append(dirs, filepath.Dir(plan.Tree.XDS.SocketPath))
	}
	if plan.Tree.SDS != nil {
		dirs = append(dirs, filepath.Dir(plan.Tree.SDS.SocketPath))
	}
	for _, d := range dirs {
		// Parents as any system directory (/var/run/secrets may not exist
		// yet); the directory itself for the proxy's group only.
		if err := os.MkdirAll(filepath.Dir(d), 0o755); err != nil {
			return fmt.Errorf("vm: %w", err)
		}
		if err := os.Mkdir(d, 0o750); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("vm: %w", err)
		}
		if err := os.Chown(d, 0, u.GID); err != nil {
			return fmt.Errorf("vm: chown %s to 0:%d: %w", d, u.GID, err)
		}
		if err := os.Chmod(d, 0o750); err != nil {
			return fmt.Errorf("vm: %w", err)
		}
	}
	return nil
}

// dropToProxyGroup makes the proxy's group the agent's: its connections
// (to the CA, to the control plane) match the capture rules'
// `-m owner --gid-owner <gid> -j RETURN` and are not redirected to Envoy.
// Istio gets the same by running pilot-agent as istio-proxy; the agent
// here must stay root (uid 0) to own the rules, reconcile them and start
// Envoy as the proxy user, and a gid change keeps every capability.
// syscall.Setgid changes every thread of the process (Go ≥ 1.16).
func dropToProxyGroup(gid int) error {
	if err := syscall.Setgid(gid); err != nil {
		return fmt.Errorf("vm: setgid(%d): %w", gid, err)
	}
	return nil
}

// vmClean is `meshagent vm clean`: istio-start.sh's clean, the rules
// removed unless ISTIO_CUSTOM_IP_TABLES=true.
func vmClean(customIPTables bool, host config.Host, cmd *cobra.Command, log *slog.Logger) error {
	if customIPTables {
		log.Info("ISTIO_CUSTOM_IP_TABLES=true: leaving iptables alone")
		return nil
	}
	cfg, err := config.BindCaptureSettings(pflag.NewFlagSet("vm", pflag.ContinueOnError)).Config(host)
	if err != nil {
		return usageError("vm clean: %v", err)
	}
	if err := cleanIptables(cfg, cmd.OutOrStdout(), log); err != nil {
		return fmt.Errorf("vm clean: %w", err)
	}
	log.Info("capture rules removed")
	return nil
}
