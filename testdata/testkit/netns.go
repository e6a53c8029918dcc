package testkit

import (
	"fmt"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// InNetns runs f on a thread in network namespace ns (a name under
// /run/netns): the sockets f opens live there, whichever thread uses them
// later. The thread is never returned to the runtime (it exits with the
// goroutine), so no other goroutine runs in ns by accident.
func InNetns(t testing.TB, ns string, f func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- enterNetns(ns, f) }()
	if err := <-errc; err != nil {
		t.Fatalf("in %s: %v", ns, err)
	}
}

// enterNetns moves the calling goroutine, locked to its thread for good,
// into network namespace ns and runs f there.
func enterNetns(ns string, f func() error) error {
	runtime.LockOSThread() // not unlocked: see InNetns
	fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns %s: %w", ns, err)
	}
	return f()
}
