package main

// --network-namespace (#23): Istio's CNI plugin runs the capture code from
// the host, on the pod's network namespace: it enters the namespace, applies,
// and leaves. We do the same on one locked OS thread: setns(2) changes only
// the calling thread, and everything the capture step starts (nft,
// iptables-restore, ip, the validation probe's sockets) is created from that
// thread, so it all lands in the pod's namespace and nothing in the host's.
//
// Two plugin calls for one pod must not interleave: Istio points iptables'
// lock at the namespace file itself (XTABLES_LOCKFILE=<netns path>), a lock
// per pod. We take an exclusive flock on the same file for the whole step,
// which also serialises us with Istio's own iptables on that pod.

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// netnsLockWait is how long a second call for the same pod waits for the
// first (iptables' --wait=30, as Istio passes it).
const netnsLockWait = 30 * time.Second

// errNetnsLocked: another capture step held the pod's lock for netnsLockWait.
var errNetnsLocked = errors.New("another capture step holds the network namespace's lock")

// inNetworkNamespace runs fn with this goroutine's thread in the network
// namespace at path (a /proc/PID/ns/net or /var/run/netns/NAME file),
// holding the namespace's lock, and returns to the original namespace.
func inNetworkNamespace(path string, log *slog.Logger, fn func() error) error {
	ns, err := openNetworkNamespace(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	if err := lockNetns(ns, path, log); err != nil {
		return err
	}
	defer unix.Flock(int(ns.Fd()), unix.LOCK_UN)

	runtime.LockOSThread()
	home, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("--network-namespace: reading this thread's namespace: %w", err)
	}
	defer home.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("--network-namespace %s: entering: %w", path, err)
	}
	defer func() {
		// A thread that cannot go home stays locked: the runtime ends it
		// with this goroutine instead of reusing it in the pod's namespace.
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			log.Error("cannot leave the pod's network namespace; this thread is discarded", "error", err)
			return
		}
		runtime.UnlockOSThread()
	}()
	log.Info("entered network namespace", "path", path)
	return fn()
}

// openNetworkNamespace opens the network namespace file at path, or says
// why it is not one, naming the flag (#33). It is opened with O_NONBLOCK:
// a FIFO named there was an open blocked for ever, with no log line; and
// it must be a namespace file (nsfs) of a network namespace, not a mount
// or a PID namespace's, before anything is applied.
func openNetworkNamespace(path string) (*os.File, error) {
	if path == "" {
		return nil, errors.New("--network-namespace is empty: want a network namespace file (/proc/PID/ns/net, /var/run/netns/NAME)")
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("--network-namespace %s: %w", path, err)
	}
	ns := os.NewFile(uintptr(fd), path)
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil || st.Type != unix.NSFS_MAGIC {
		kind := fileKind(ns)
		ns.Close()
		return nil, fmt.Errorf("--network-namespace %s: not a namespace file (nsfs): %s", path, kind)
	}
	kind, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	if err != nil || kind != unix.CLONE_NEWNET {
		ns.Close()
		return nil, fmt.Errorf("--network-namespace %s: a namespace file, but not of a network namespace", path)
	}
	return ns, nil
}

// fileKind says what an open file is, for an error.
func fileKind(f *os.File) string {
	fi, err := f.Stat()
	switch {
	case err != nil:
		return err.Error()
	case fi.Mode()&os.ModeNamedPipe != 0:
		return "a FIFO"
	case fi.Mode()&os.ModeCharDevice != 0:
		return "a character device"
	case fi.Mode()&os.ModeDevice != 0:
		return "a block device"
	case fi.Mode()&os.ModeSocket != 0:
		return "a socket"
	case fi.IsDir():
		return "a directory"
	}
	return "a regular file"
}

// lockNetns takes the exclusive flock on the namespace file, waiting up to
// netnsLockWait for another holder, and logs once that it waits.
func lockNetns(ns *os.File, path string, log *slog.Logger) error {
	deadline := time.Now().Add(netnsLockWait)
	for waited := false; ; waited = true {
		err := unix.Flock(int(ns.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("--network-namespace %s: locking: %w", path, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s, after %s", errNetnsLocked, path, netnsLockWait)
		}
		if !waited {
			log.Info("waiting for the network namespace's lock", "path", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
