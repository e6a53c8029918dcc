package testkit

import (
	"context"
	"fmt"
	"net"
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

// NetnsDialer dials from network namespace ns (a name under /run/netns),
// for a client in the test process that must reach an address only ns
// routes (an HTTP transport's DialContext: the kube node's registry, #32).
// Each connection costs a thread, which InNetns's rule retires.
func NetnsDialer(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type dialed struct {
			conn net.Conn
			err  error
		}
		done := make(chan dialed, 1)
		go func() {
			var d dialed
			if err := enterNetns(ns, func() error {
				d.conn, d.err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return nil
			}); err != nil {
				d.err = err
			}
			done <- d
		}()
		d := <-done
		return d.conn, d.err
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
