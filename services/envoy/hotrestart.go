package envoy

// Hot restart by epochs (#25), for the changes xDS cannot deliver: a new
// bootstrap (the mesh config file, ProxyConfig fields that shape it, the
// template) or a new Envoy binary. Opt-in: without it the command line and
// the behaviour stay Istio's (--disable-hot-restart; a change waits for the
// next start).
//
// With it, a change of what Envoy is started from is validated
// (envoy --mode validate) and then started as the next epoch beside the
// running Envoy, with --restart-epoch, a stable --base-id and
// --parent-shutdown-time-s: the new Envoy takes the listening sockets over
// from the old one, asks it to drain, and tells it to exit after the parent
// shutdown time. The invariants are Envoy's own hot restarter's, which
// Istio's agent broke when it restarted by epochs: at most two epochs at
// once (a change during an overlap waits; istio#27087 was the OOM of the
// overlap), and an epoch number always one more than a live parent's (a
// new Envoy that exits before it takes over leaves the old one serving and
// the next try numbered after the old one again; istio#35740 was the
// counter left pointing at a dead parent). Epochs and their events are
// run by epochs.go.

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshagent/meshagent/services/envoy/bootstrap"
	"github.com/meshagent/meshagent/services/internal/atomicfile"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/services/internal/cgroupmem"
)

// DefaultParentShutdownDuration is Istio's old parentShutdownDuration
// (1m0s, removed from ProxyConfig with hot restart): how long the old
// epoch lives after the new one has taken over.
const DefaultParentShutdownDuration = time.Minute

// DefaultTakeOverTimeout bounds how long a new epoch may start beside the
// old one before it is killed as a failed epoch (overlap.go, nextOverdue).
// Envoy has no such bound, and with Istio's initial_fetch_timeout of 0 an
// epoch waiting on configuration or a secret that never comes waits for
// ever; a minute is Istio's old parent shutdown time, the most two epochs
// were meant to overlap.
const DefaultTakeOverTimeout = time.Minute

// DefaultHotRestartDebounce is the quiet time after an edit of a watched
// file before it is looked at: editors and ConfigMap updates write in bursts.
const DefaultHotRestartDebounce = 200 * time.Millisecond

// validateTimeout bounds envoy --mode validate.
const validateTimeout = time.Minute

// Errors of a hot restart that did not happen, checked with errors.Is.
var (
	// ErrNotValid: envoy --mode validate refused the new bootstrap.
	ErrNotValid = errors.New("new bootstrap does not validate")
	// ErrNoRoomForTwo: the container's memory limit cannot hold a second
	// Envoy beside the running one.
	ErrNoRoomForTwo = errors.New("memory limit cannot hold two envoys")
)

// HotRestartConfig turns hot restart on (#25).
type HotRestartConfig struct {
	// BaseID is Envoy's --base-id, the same for every epoch: it names the
	// shared memory and the unix sockets by which an epoch finds its
	// parent, so two agents in one network namespace need different ones.
	BaseID int
	// ParentShutdownDuration is --parent-shutdown-time-s: how long the old
	// epoch lives after the new one has taken over (whole seconds; longer
	// than --drain-time-s, so that it drains before it is told to exit:
	// Istio's old values were 45s and 60s).
	ParentShutdownDuration time.Duration
	// TakeOverTimeout: a new epoch not ready within it is killed as a
	// failed epoch, and the old one serves on (0: DefaultTakeOverTimeout,
	// set by withDefaults).
	TakeOverTimeout time.Duration
	// Watch are the files the bootstrap and Envoy's command line are made
	// from: the mesh config file, the pod's annotations and labels, the
	// bootstrap template, the override file. Envoy's binary is watched as
	// well, without being named here.
	Watch []string
	// Reload builds the Config again from the files as they are now (cmd's
	// translation of the ProxyConfig sources); its HotRestart is not used,
	// except for its Watch. An error is logged and leaves Envoy alone.
	Reload func() (Config, error)
	// Debounce is the quiet time after an edit (DefaultHotRestartDebounce
	// when 0).
	Debounce time.Duration
	// CgroupRoot is where "/" is for the memory cgroup's files ("" in
	// production; tests give a made-up tree).
	CgroupRoot string
}

// validate reports an invalid field.
func (hr *HotRestartConfig) validate() error {
	var errs []error
	if hr.BaseID < 0 {
		errs = append(errs, fmt.Errorf("%w: HotRestart.BaseID %d is negative", ErrInvalidConfig, hr.BaseID))
	}
	if hr.ParentShutdownDuration < time.Second {
		errs = append(errs, fmt.Errorf("%w: HotRestart.ParentShutdownDuration %v: want at least 1s", ErrInvalidConfig, hr.ParentShutdownDuration))
	}
	if hr.TakeOverTimeout < 0 {
		errs = append(errs, fmt.Errorf("%w: HotRestart.TakeOverTimeout %v is negative", ErrInvalidConfig, hr.TakeOverTimeout))
	}
	if hr.Reload == nil {
		errs = append(errs, fmt.Errorf("%w: HotRestart.Reload is nil", ErrInvalidConfig))
	}
	return errors.Join(errs...)
}

// args turns Istio's command line (which has --disable-hot-restart) into
// the hot-restart one of restartEpoch, the flags in the place of
// --disable-hot-restart.
func (hr *HotRestartConfig) args(args []string, restartEpoch int) []string {
	flags := []string{
		"--restart-epoch", strconv.Itoa(restartEpoch),
		"--base-id", strconv.Itoa(hr.BaseID),
		"--parent-shutdown-time-s", strconv.Itoa(int(hr.ParentShutdownDuration.Seconds())),
	}
	out := make([]string, 0, len(args)+len(flags))
	for _, a := range args {
		if a == "--disable-hot-restart" {
			out = append(out, flags...)
			flags = nil
			continue
		}
		out = append(out, a)
	}
	return append(out, flags...) // a hand-made line without the flag
}

// generation is what an epoch is started from: the binary, its command
// line (without the epoch's flags) and its bootstrap as written. Two
// generations that are the same need no hot restart.
type generation struct {
	cfg    Config
	binary string
	// binaryFile is the binary's file as stat sees it: the same file is
	// the same binary; another (a new Envoy renamed over the path, or the
	// same one touched) is compared by content (sameBinary).
	binaryFile fileID
	args       []string
	bootPath   string
	boot       []byte
	// rendered is the bootstrap as the service keeps it.
	rendered *bootstrap.Rendered
}

// changes names what differs between the serving generation g, run by
// process pid, and o; none when o starts the same Envoy. An error: o's
// binary cannot be read (ErrBinary).
func (g *generation) changes(o *generation, pid int) ([]string, error) {
	var what []string
	same, err := g.sameBinary(o, pid)
	if err != nil {
		return nil, err
	}
	if !same {
		what = append(what, "binary")
	}
	if g.bootPath != o.bootPath || string(g.boot) != string(o.boot) {
		what = append(what, "bootstrap")
	}
	if !slices.Equal(g.args, o.args) {
		what = append(what, "command line")
	}
	return what, nil
}

// sameBinary says whether o's binary is the one g's Envoy (process pid)
// runs: the same path and file, or, for another file at the path, the same
// content as the running executable (/proc/<pid>/exe, which still reads
// the old file after a new one was renamed over it). Hashing only then
// keeps a cold start of Envoy from reading its whole binary (#25). o's
// binary is read through the bounded reader: a FIFO or a device put at the
// path is an error at once, never a hash that blocks or reads for ever in
// the run loop (#33).
func (g *generation) sameBinary(o *generation, pid int) (bool, error) {
	if g.binary != o.binary {
		return false, nil
	}
	if g.binaryFile == o.binaryFile {
		return true, nil
	}
	now, err := hashFile(o.binary)
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrBinary, err)
	}
	running, err := hashFile(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false, nil // the running one unreadable: a hot restart is the safe side
	}
	return now == running, nil
}

// fileID identifies a file's version: a file replaced or written has
// another.
type fileID struct {
	dev, ino   uint64
	size, time int64
}

func statFile(path string) (fileID, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	id := fileID{size: st.Size(), time: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(sys.Dev), sys.Ino
	}
	return id, nil
}

// newGeneration reads what Envoy will be started from with cfg and args,
// the bootstrap already written.
func newGeneration(cfg Config, args []string, rendered *bootstrap.Rendered) (*generation, error) {
	g := &generation{cfg: cfg, binary: cfg.BinaryPath, args: args, rendered: rendered}
	id, err := statFile(cfg.BinaryPath)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBinary, err)
	}
	g.binaryFile = id
	if g.bootPath = configPathArg(args); g.bootPath != "" {
		if g.boot, err = boundedfile.Read(g.bootPath, boundedfile.MaxConfig); err != nil {
			return nil, fmt.Errorf("read the bootstrap: %w", err)
		}
	}
	return g, nil
}

// render prepares cfg's bootstrap and command line from scratch (no kept
// bytes: the point is to see the files as they are now) and returns the
// generation; the bootstrap file is written in place.
func render(cfg Config) (*generation, error) {
	if err := checkBinary(cfg.BinaryPath); err != nil {
		return nil, err
	}
	rendered, err := cfg.render(nil)
	if err != nil {
		return nil, err
	}
	return newGeneration(cfg, CommandLine(cfg.Args, rendered.File), rendered)
}

// restore writes the bootstrap of g (the serving generation) back in place
// after a new one was rendered over it and not taken: a cold start of
// Envoy after a crash must get the bootstrap that runs. A bootstrap that is
// not ours (a custom config file) is left alone.
func (s *Service) restore(g *generation) {
	if g == nil || g.bootPath == "" || g.boot == nil || (g.rendered != nil && g.rendered.Custom) {
		return
	}
	if err := atomicfile.Write(g.bootPath, g.boot, 0o644); err != nil {
		s.log.Warn("writing back the running envoy's bootstrap", "file", g.bootPath, "error", err)
	}
}

// configPathArg is the value of -c / --config-path in args, "" if none.
func configPathArg(args []string) string {
	for i, a := range args {
		if (a == "-c" || a == "--config-path") && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// hashFile is the SHA-256 of the regular file at path, at most
// boundedfile.MaxBinary long.
func hashFile(path string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	h := sha256.New()
	if _, err := boundedfile.Copy(h, path, boundedfile.MaxBinary); err != nil {
		return sum, err
	}
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

// validateBootstrap runs envoy --mode validate on g's command line, as
// Envoy's own check of a bootstrap before it is used, and says why it
// failed (Envoy's last lines of output).
func validateBootstrap(ctx context.Context, g *generation) error {
	ctx, cancel := context.WithTimeout(ctx, validateTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.binary, append(slices.Clone(g.args), "--mode", "validate")...)
	cmd.Env = g.cfg.Env
	tail := newTailBuffer(2048)
	cmd.Stdout, cmd.Stderr = tail, tail
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		out := strings.TrimSpace(string(tail.Bytes()))
		return fmt.Errorf("%w: %s --mode validate: %v: %s", ErrNotValid, g.binary, err, out)
	}
	return nil
}

// roomForTwo says whether the container's memory limit holds a second
// Envoy the size of the running one (pid) beside what the container uses
// now; it is nil when the cgroup has no limit, and cgroupmem.ErrUnknown
// when there is no cgroup to read.
func roomForTwo(cgroupRoot string, pid int) error {
	m, err := cgroupmem.Self(cgroupRoot)
	if errors.Is(err, cgroupmem.ErrUnknown) {
		return err
	}
	if err == nil && m.Limit == 0 {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: reading the memory cgroup: %v", ErrNoRoomForTwo, err)
	}
	rss, err := cgroupmem.RSS(pid)
	if err != nil {
		return fmt.Errorf("%w: reading the running envoy's memory: %v", ErrNoRoomForTwo, err)
	}
	if m.Usage+rss > m.Limit {
		return fmt.Errorf("%w: the container uses %d MiB of its %d MiB limit (%s) and the running envoy (pid %d) holds %d MiB; a second one would not fit",
			ErrNoRoomForTwo, m.Usage>>20, m.Limit>>20, m.Dir, pid, rss>>20)
	}
	return nil
}
