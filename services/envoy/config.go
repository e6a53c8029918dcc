package envoy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/meshagent/meshagent/services/envoy/bootstrap"
)

// The service's own operational defaults. Istio's values (binary path,
// admin port, drain durations, drain query) are not defaults here: cmd
// passes them explicitly, from its table of Istio's names.
const (
	// DefaultKillGrace is how long Envoy has to exit after SIGTERM before it
	// gets SIGKILL. Istio kills at once after the drain (Process.Kill); we
	// let Envoy flush its logs and close its sockets first.
	DefaultKillGrace = 5 * time.Second
	// DefaultReadyPollInterval is how often Envoy's readiness is polled
	// while it starts (the poll stops once Envoy is ready). Istio's agent
	// asks Envoy on every probe instead; at 100 ms ours reported ready up
	// to 100 ms after Envoy was (the end-to-end test on Istio's istiod),
	// at 20 ms 10 ms late on average, out of a start of about 100 (#24).
	// A local admin request every 5 ms for the first slowReadyPollAfter of
	// a start costs nothing; a start that takes longer (the control plane
	// is not there yet) is polled at slowReadyPollInterval.
	DefaultReadyPollInterval = 5 * time.Millisecond
	slowReadyPollAfter       = 2 * time.Second
	slowReadyPollInterval    = 20 * time.Millisecond
	// activeConnectionsPollInterval is Istio's activeConnectionCheckDelay.
	activeConnectionsPollInterval = time.Second
)

// Sentinel errors, checked with errors.Is.
var (
	// ErrEnvoyExited: Envoy exited without being asked to. The error Serve
	// returns is an *ExitError that carries the exit status.
	ErrEnvoyExited = errors.New("envoy exited")
	// ErrDrained: Envoy was drained (or stopped by an immediate Drain) and
	// stopped on purpose. Serve's error also wraps suture.ErrDoNotRestart.
	ErrDrained = errors.New("envoy drained and stopped")
	// ErrBinary: the Envoy binary is missing or cannot be executed.
	ErrBinary = errors.New("envoy binary unusable")
	// ErrPrepare: writing the bootstrap or making the arguments for a start
	// failed.
	ErrPrepare = errors.New("prepare envoy start")
	// ErrInvalidConfig: a Config field is invalid.
	ErrInvalidConfig = errors.New("invalid envoy config")
)

// Credential is the user and group Envoy runs as (Istio: uid/gid 1337 when
// the agent runs as root and DNS_PROXY_ADDR ends in ":53").
type Credential struct {
	UID, GID uint32
}

// Config is how to run Envoy. Every field is explicit, zero included
// (MinimumDrainDuration 0 means no minimum), except KillGrace,
// ReadyPollInterval, Stdout and Stderr, which take the defaults above.
type Config struct {
	// BinaryPath is Envoy's executable (ProxyConfig.binaryPath).
	BinaryPath string
	// Bootstrap and Args are Envoy's bootstrap and command line: the
	// bootstrap is rendered for the first start (bootstrap.Render) and
	// written again from the same bytes before a restart (render.go).
	Bootstrap *bootstrap.Config
	Args      ArgsConfig
	// AdminAddr is host:port of Envoy's admin API (ProxyConfig.proxyAdminPort).
	AdminAddr string
	// DrainQuery is the query of POST /drain_listeners: Istio's
	// "inboundonly&graceful" for a sidecar, "graceful" for a gateway. A
	// drain that keeps Envoy running (Istio's POST /drain) adds "&skip_exit".
	DrainQuery string
	// TerminationDrainDuration is how long a drain lasts
	// (ProxyConfig.terminationDrainDuration), unless Drain.Deadline says otherwise.
	TerminationDrainDuration time.Duration
	// MinimumDrainDuration is how long a drain lasts at least when
	// ExitOnZeroActiveConnections is set (MINIMUM_DRAIN_DURATION); 0 checks
	// the connections at once.
	MinimumDrainDuration time.Duration
	// ExitOnZeroActiveConnections ends a drain as soon as Envoy has no active
	// downstream connection (EXIT_ON_ZERO_ACTIVE_CONNECTIONS).
	ExitOnZeroActiveConnections bool
	// ExcludedListeners are the listener stat names (as in
	// "listener.<name>.downstream_cx_active") that do not count as active
	// connections: the agent's own listeners (bootstrap.Config.AgentListenerStats).
	ExcludedListeners []string
	// KillGrace is how long Envoy has after SIGTERM before SIGKILL.
	KillGrace time.Duration
	// ReadyPollInterval is how often admin /ready is polled.
	ReadyPollInterval time.Duration
	// RunAs, when not nil, is the uid/gid Envoy runs as; nil inherits ours.
	RunAs *Credential
	// Stdout and Stderr receive Envoy's output (default: ours).
	Stdout, Stderr io.Writer
	// Env is Envoy's environment; nil inherits the agent's.
	Env []string
	// CrashDir is where a record of each unexpected exit is kept, the last
	// MaxCrashRecords (crashes.go); empty keeps none.
	CrashDir string
	// HotRestart, when set, turns on Envoy hot restart (hotrestart.go,
	// #25); nil keeps Istio's --disable-hot-restart.
	HotRestart *HotRestartConfig
}

// withDefaults returns cfg with the operational defaults filled in.
func (cfg Config) withDefaults() Config {
	if cfg.KillGrace == 0 {
		cfg.KillGrace = DefaultKillGrace
	}
	if cfg.ReadyPollInterval == 0 {
		cfg.ReadyPollInterval = DefaultReadyPollInterval
	}
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if hr := cfg.HotRestart; hr != nil && (hr.TakeOverTimeout == 0 || hr.Debounce <= 0) {
		withDefaults := *hr // the caller's struct is left as it is
		if withDefaults.TakeOverTimeout == 0 {
			withDefaults.TakeOverTimeout = DefaultTakeOverTimeout
		}
		if withDefaults.Debounce <= 0 {
			withDefaults.Debounce = DefaultHotRestartDebounce
		}
		cfg.HotRestart = &withDefaults
	}
	return cfg
}

// Validate reports every invalid field, by name and value, the bootstrap's
// included.
func (cfg Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if cfg.BinaryPath == "" {
		bad("BinaryPath is empty (ProxyConfig.binaryPath)")
	}
	if _, _, err := net.SplitHostPort(cfg.AdminAddr); err != nil {
		bad("AdminAddr %q: %v", cfg.AdminAddr, err)
	}
	if cfg.DrainQuery == "" {
		bad("DrainQuery is empty: want Istio's inboundonly&graceful (sidecar) or graceful (gateway)")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"TerminationDrainDuration", cfg.TerminationDrainDuration},
		{"MinimumDrainDuration", cfg.MinimumDrainDuration},
		{"KillGrace", cfg.KillGrace},
		{"ReadyPollInterval", cfg.ReadyPollInterval},
	} {
		if d.v < 0 {
			bad("%s %v is negative", d.name, d.v)
		}
	}
	if cfg.HotRestart != nil {
		errs = append(errs, cfg.HotRestart.validate())
	}
	if cfg.Bootstrap == nil {
		bad("Bootstrap is not set")
	} else {
		errs = append(errs, cfg.Bootstrap.Validate())
	}
	return errors.Join(errs...)
}
