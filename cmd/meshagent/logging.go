package main

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
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

// newLogger builds the agent's logger from --log_output_level (Istio's
// "scope:level,scope:level" or a bare level) and --log_as_json.
func newLogger(o logOptions, w io.Writer) (*slog.Logger, error) {
	level, err := parseLogLevel(o.outputLevel)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: level}
	if o.asJSON {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// parseLogLevel takes the level of the "default" scope (or of a bare level).
// Istio's levels: debug, info, warn, error, fatal, none.
func parseLogLevel(spec string) (slog.Level, error) {
	level := "info"
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		scope, lvl, scoped := strings.Cut(part, ":")
		if !scoped {
			level = scope
		} else if scope == "default" {
			level = lvl
		}
	}
	switch level {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error", "fatal":
		return slog.LevelError, nil
	case "none":
		return slog.LevelError + 100, nil
	}
	return 0, fmt.Errorf("--log_output_level %q: level %q is not one of debug, info, warn, error, fatal, none", spec, level)
}
