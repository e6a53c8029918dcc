package testkit

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// enterNetns moves the calling goroutine, locked to its thread for good,
// into network namespace ns and runs f there.
func enterNetns(ns string, f func() error) error {
	runtime.LockOSThread() // not unlocked: the thread exits with the goroutine, so no other goroutine runs in ns by accident
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
