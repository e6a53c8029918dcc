package main

// The command line's shared pieces, at the bottom of the package: every
// command takes a cliContext and returns exitError or usageError (#34:
// main.go held them, and ten files below it reached back up for them).

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
	"github.com/meshagent/meshagent/services/certs"
)

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
	startAgent func(cfg *config.Plan) error
	// workloadKey: the key main started generating (proxy, #36), for the
	// certs service; nil: none.
	workloadKey *certs.EarlyKey
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
