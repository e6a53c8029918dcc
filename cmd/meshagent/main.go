// Command meshagent is a sidecar agent for Envoy-based service meshes: a
// drop-in for Istio's pilot-agent built as a supervision tree.
package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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
	return execute(&cliContext{name: calledAs(os.Args[0]), args: args, host: realHost(), stdout: stdout, stderr: stderr})
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

// cliContext is one execution of the command line: its arguments, the host
// it reads, and where it writes.
type cliContext struct {
	name           string // what help and errors call the command; "" is meshagent
	args           []string
	host           config.Host
	stdout, stderr io.Writer
	// startAgent, when set, takes an agent command's configuration once its
	// tree is built (its services' configs validated), instead of running
	// it: tests that check what a command line configures.
	startAgent func(cfg *config.Agent) error
}

// start builds the tree of the agent a command configured, and runs it.
func (cli *cliContext) start(cfg *config.Agent, reg *prometheus.Registry, log *slog.Logger) error {
	agent, ch, err := buildTree(cfg, reg, log)
	if err != nil {
		return err
	}
	if cli.startAgent != nil {
		return cli.startAgent(cfg)
	}
	return runAgent(cfg, agent, ch, reg, log)
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

func (cli *cliContext) commandName() string {
	if cli.name == "" {
		return "meshagent"
	}
	return cli.name
}

// exitError carries the exit code a command wants.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageError is a bad flag or value: exit code 2, as for an unknown flag.
func usageError(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
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

// unknownFlags are the flags in args that fs does not define (pflag drops
// them silently when they are tolerated). A value after an unknown flag is
// skipped as pflag skips it; everything after "--" is an argument.
func unknownFlags(fs *pflag.FlagSet, args []string) []string {
	var unknown []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return unknown
		case strings.HasPrefix(a, "--"):
			name, _, hasValue := strings.Cut(a[2:], "=")
			f := fs.Lookup(name)
			if f == nil {
				unknown = append(unknown, "--"+name)
				if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
					i++
				}
			} else if !hasValue && f.NoOptDefVal == "" {
				i++ // the known flag's value
			}
		case strings.HasPrefix(a, "-") && len(a) > 1:
			shorts := a[1:]
			for j := 0; j < len(shorts); j++ {
				f := fs.ShorthandLookup(shorts[j : j+1])
				if f == nil {
					unknown = append(unknown, "-"+shorts[j:j+1])
					break
				}
				if f.NoOptDefVal == "" { // takes a value: the rest, or the next argument
					if j == len(shorts)-1 {
						i++
					}
					break
				}
			}
		}
	}
	return unknown
}
