package envoy

import (
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/services/envoy/bootstrap"
)

// ArgsConfig is what Envoy's command line needs besides the bootstrap, filled by cmd with every
// value (Istio's defaults are in cmd's table).
type ArgsConfig struct {
	DrainDuration      time.Duration // ProxyConfig.drainDuration (45s) ⇒ --drain-time-s, whole seconds
	FileFlushInterval  time.Duration // ProxyConfig.fileFlushInterval (1s) ⇒ --file-flush-interval-msec; 0 ⇒ 1000
	FileFlushMinSizeKB int           // ProxyConfig.fileFlushMinSizeKb ⇒ --file-flush-min-size-kb; 0 ⇒ omitted
	LogLevel           string        // --proxyLogLevel (warning): "info,misc:error" ⇒ -l info --component-log-level misc:error
	ComponentLogLevel  string        // --proxyComponentLogLevel, used only if LogLevel names no component
	Concurrency        int           // ProxyConfig.concurrency / ISTIO_CPU_LIMIT / --concurrency; 0 ⇒ omitted
	IPv6               bool          // all node IPs are IPv6 (AllIPv6) ⇒ --local-address-ip-version v6
	SkipDeprecatedLogs bool          // ENVOY_SKIP_DEPRECATED_LOGS (default true) ⇒ --skip-deprecated-logs
	EnableCoreDump     bool          // ISTIO_ENVOY_ENABLE_CORE_DUMP ⇒ --enable-core-dump
}

// CommandLine is Envoy's argument list (without the binary), in the order Istio's agent builds it.
func CommandLine(a ArgsConfig, b bootstrap.File) []string {
	ipVersion := "v4"
	if a.IPv6 {
		ipVersion = "v6"
	}
	flush := a.FileFlushInterval.Milliseconds()
	if flush <= 0 {
		flush = 1000
	}
	args := []string{
		"-c", b.Path,
		"--drain-time-s", strconv.Itoa(int(a.DrainDuration.Seconds())),
		"--drain-strategy", "immediate", // clients learn of the drain as soon as it starts
		"--local-address-ip-version", ipVersion,
		"--file-flush-interval-msec", strconv.FormatInt(flush, 10),
		"--disable-hot-restart", // a single Envoy per agent; hot restart only adds shared-memory state
		"--allow-unknown-static-fields",
	}
	if a.FileFlushMinSizeKB > 0 {
		args = append(args, "--file-flush-min-size-kb", strconv.Itoa(a.FileFlushMinSizeKB))
	}
	level, components := SplitLogLevel(a.LogLevel)
	if level != "" {
		args = append(args, "-l", level)
	}
	if len(components) > 0 {
		args = append(args, "--component-log-level", strings.Join(components, ","))
	} else if a.ComponentLogLevel != "" {
		args = append(args, "--component-log-level", a.ComponentLogLevel)
	}
	if a.SkipDeprecatedLogs {
		args = append(args, "--skip-deprecated-logs")
	}
	if a.EnableCoreDump {
		args = append(args, "--enable-core-dump")
	}
	if b.ConfigYAML != "" {
		args = append(args, "--config-yaml", b.ConfigYAML) // Envoy accepts JSON here too
	}
	if a.Concurrency > 0 {
		args = append(args, "--concurrency", strconv.Itoa(a.Concurrency))
	}
	return args
}

// SplitLogLevel splits Istio's single log level setting ("info,misc:error,upstream:debug") into
// Envoy's -l level (the last plain entry) and component levels; entries with two or more ':' are
// dropped, as Istio does.
func SplitLogLevel(s string) (level string, components []string) {
	if s == "" {
		return "", nil
	}
	for part := range strings.SplitSeq(s, ",") {
		switch strings.Count(part, ":") {
		case 0:
			level = part
		case 1:
			components = append(components, part)
		}
	}
	return level, components
}
