// Command meshagent is a sidecar agent for Envoy-based service meshes: a
// drop-in for Istio's pilot-agent built as a supervision tree.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/certs"
)

func main() {
	if code, handled := runAsInit(); handled {
		os.Exit(code)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line on the real host and returns the process
// exit code: 0 success, 2 bad usage (unknown flag where one is not
// tolerated, invalid value), otherwise what the command chose (1 by
// default).
func run(args []string, stdout, stderr io.Writer) int {
	// The workload key first (#36): an RSA key is ~80 ms of CPU on an idle
	// core and the certificate is on the path to Ready, so it is made
	// while the configuration is parsed, the tree built and Envoy started;
	// the certs service takes it (Config.EarlyKey).
	host := realHost()
	var key *certs.EarlyKey
	if ks, ok := config.WorkloadKey(host.Env, args); ok {
		key = certs.StartKey(ks, messages.SystemClock{})
	}
	return execute(&cliContext{name: calledAs(os.Args[0]), args: args, host: host, workloadKey: key, stdout: stdout, stderr: stderr})
}

// calledAs is the name help and errors give the command: "pilot-agent"
// when it is installed as Istio's agent (the proxyv2 image, #20), where
// Istio's injector, hooks and tools call it by that name; else meshagent.
func calledAs(argv0 string) string {
	if filepath.Base(argv0) == "pilot-agent" {
		return "pilot-agent"
	}
	return "meshagent"
}

// execute runs cli's command line and returns the exit code.
func execute(cli *cliContext) int {
	stderr := cli.stderr
	root := newRootCommand(cli)
	root.SetArgs(cli.args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "%s: %v\n", cli.commandName(), err)
	var exit *exitError
	if errors.As(err, &exit) {
		return exit.code
	}
	return 1
}

func newRootCommand(cli *cliContext) *cobra.Command {
	root := &cobra.Command{
		Use:           cli.commandName(),
		Short:         "Sidecar agent for Envoy-based service meshes (a drop-in for Istio's pilot-agent)",
		SilenceUsage:  true,
		SilenceErrors: true,
		// Unknown flags are tolerated on the root command, as Istio's
		// pilot-agent does (and named in a warning).
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if unknown := unknownFlags(cmd.Flags(), cli.args); len(unknown) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: warning: ignoring unknown flags %s\n", cli.commandName(), strings.Join(unknown, " "))
			}
			return cmd.Help()
		},
	}
	root.SetOut(cli.stdout)
	root.SetErr(cli.stderr)
	// Flag errors (unknown flag, bad value) are usage errors: exit code 2.
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &exitError{code: 2, err: fmt.Errorf("%s: %w (see '%s --help')", c.CommandPath(), err, c.CommandPath())}
	})
	logs := &logOptions{}
	addLogFlags(root.PersistentFlags(), logs)
	root.AddCommand(
		newProxyCommand(cli, logs),
		newStandaloneCommand(cli, logs),
		newVMCommand(cli, logs),
		newWaitCommand(),
		newRequestCommand(),
		newProxyStatusCommand(),
		newProxyConfigCommand(),
		newVersionCommand(),
		newImageCommand(cli),
		newEnvHelpTopic(),
		newIstioIptablesCommand(cli.host), newCleanIptablesCommand(cli.host),
	)
	return root
}
