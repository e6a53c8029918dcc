package testkit

import (
	"context"
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
)

// A port bound by a socket that does not listen yet (as the stand-in Envoy
// holds its listeners until its workers start) is not free: Go's own
// Listen, with SO_REUSEADDR, would take it (#36).
func TestFreePortsSkipAPortBoundAndNotListening(t *testing.T) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))

	if l, err := net.Listen("tcp", addr); err == nil {
		l.Close() // the hole: Go's Listen takes a port bound and not listening
	} else {
		t.Logf("Go's Listen on %s: %v (this kernel refuses it anyway)", addr, err)
	}
	l, err := exclusive.Listen(context.Background(), "tcp", addr)
	if err == nil {
		l.Close()
		t.Fatalf("FreePorts' listen on %s, bound by another socket: no error, want address in use", addr)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("FreePorts' listen on %s: %v, want address in use", addr, err)
	}
}
