package main

import (
	"io"
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/meshagent/meshagent/cmd/meshagent/config"
)

// logOptions are Istio's global logging flags. meshagent honours
// --log_as_json and the default scope of --log_output_level; the rest are
// accepted so that Istio command lines keep working.
type logOptions struct {
	asJSON      bool
	outputLevel string
	// accepted for compatibility, not used
	caller, stacktraceLevel, target, rotate    string
	rotateMaxAge, rotateMaxSize, rotateMaxBack int
}

func addLogFlags(pf *pflag.FlagSet, logs *logOptions) {
	pf.BoolVar(&logs.asJSON, "log_as_json", false, "Whether to format output as JSON or in plain console-friendly format")
	pf.StringVar(&logs.outputLevel, "log_output_level", "default:info", "Comma-separated minimum per-scope logging level of messages to output, in the form of <scope>:<level>,<scope>:<level>,... where level is one of [debug, info, warn, error, fatal, none]; meshagent uses the default scope's level")
	// Istio's other logging flags, accepted so that Istio command lines keep working.
	pf.StringVar(&logs.caller, "log_caller", "", "Accepted for compatibility with Istio; ignored")
	pf.StringVar(&logs.stacktraceLevel, "log_stacktrace_level", "default:none", "Accepted for compatibility with Istio; ignored")
	pf.StringVar(&logs.target, "log_target", "stdout", "Accepted for compatibility with Istio; meshagent logs to stderr")
	pf.StringVar(&logs.rotate, "log_rotate", "", "Accepted for compatibility with Istio; ignored")
	pf.IntVar(&logs.rotateMaxAge, "log_rotate_max_age", 30, "Accepted for compatibility with Istio; ignored")
	pf.IntVar(&logs.rotateMaxSize, "log_rotate_max_size", 104857600, "Accepted for compatibility with Istio; ignored")
	pf.IntVar(&logs.rotateMaxBack, "log_rotate_max_backups", 1000, "Accepted for compatibility with Istio; ignored")
}

// newLogger builds the agent's logger from --log_output_level (Istio's
// "scope:level,scope:level" or a bare level) and --log_as_json.
func newLogger(o logOptions, w io.Writer) (*slog.Logger, error) {
	level, err := config.ParseLogLevel(o.outputLevel)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: level}
	if o.asJSON {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// startRun is how an agent command's run begins: its logger, and its
// settings resolved from env. Bad log options give a plain text logger
// meanwhile; the configuration's checks (config.Build) report them
// with the other bad values, which stay in s.problems.
func startRun(s *config.Settings, env *config.Reader, logs logOptions, w io.Writer) *slog.Logger {
	log, err := newLogger(logs, w)
	if err != nil {
		log = slog.New(slog.NewTextHandler(w, nil))
	}
	_ = s.Resolve(env)
	return log
}
