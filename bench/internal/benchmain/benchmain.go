// Package benchmain is what the benchmark mains that run one service alone
// (dnsproxyd, xdsproxyd) share: the -v, -cpuprofile and -memprofile flags,
// the logger, and a run until SIGINT or SIGTERM that ends the process with
// status 1 when it fails.
package benchmain

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"syscall"
)

// Flags are the shared flags, defined on the command line's flag set.
type Flags struct {
	name       string
	quiet      slog.Level
	verbose    *bool
	cpuProfile *string
	memProfile *string
}

// Define defines the shared flags for the command called name, whose log
// shows quiet and above unless -v asks for debug logs. Call it before
// flag.Parse.
func Define(name string, quiet slog.Level) *Flags {
	return &Flags{
		name:       name,
		quiet:      quiet,
		verbose:    flag.Bool("v", false, "debug logs"),
		cpuProfile: flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (pprof)"),
		memProfile: flag.String("memprofile", "", "write an allocation profile (pprof allocs) to this file at exit"),
	}
}

// Logger is the command's log, on stderr.
func (f *Flags) Logger() *slog.Logger {
	level := f.quiet
	if *f.verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// Run runs run until SIGINT or SIGTERM cancels its context, profiling as
// the flags ask, and exits the process: 2 when a profile cannot be
// started, 1 when run failed other than by the signal.
func (f *Flags) Run(log *slog.Logger, run func(ctx context.Context) error) {
	if *f.cpuProfile != "" {
		out, err := os.Create(*f.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(out)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: -cpuprofile: %v\n", f.name, err)
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if *f.cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	if *f.memProfile != "" {
		if perr := writeAllocs(*f.memProfile); perr != nil {
			log.Error("memprofile", "error", perr)
		}
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Error(f.name+" failed", "error", err)
		os.Exit(1)
	}
}

// writeAllocs writes the allocation profile, after a collection so that
// its in-use figures are current.
func writeAllocs(path string) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	runtime.GC()
	return pprof.Lookup("allocs").WriteTo(out, 0)
}
