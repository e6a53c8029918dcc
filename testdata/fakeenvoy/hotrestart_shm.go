package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sharedMemory is Envoy's hot restart shared memory (#25): the one piece
// of it the stand-in keeps is the INITIALIZING flag that stops a new epoch
// while the previous one is still starting (attachSharedMemory in
// hot_restart_impl.cc). Envoy's layout: size_, version_, two
// pthread_mutex_t (left zero here), flags_: 104 bytes.
type sharedMemory struct {
	mem   []byte
	flags *uint64
}

const (
	shmSize             = 104
	shmVersion          = 11 // Envoy's HOT_RESTART_VERSION
	shmFlagsOffset      = 96
	shmFlagInitializing = 1 // SHMEM_FLAGS_INITIALIZING
)

// shmPath is where shm_open("/envoy_shared_memory_<id>") puts it.
func shmPath(scaledBaseID int) string {
	return fmt.Sprintf("/dev/shm/envoy_shared_memory_%d", scaledBaseID)
}

func attachSharedMemory(scaledBaseID, epoch int) (*sharedMemory, error) {
	path := shmPath(scaledBaseID)
	flags := os.O_RDWR
	if epoch == 0 {
		// Envoy: the first epoch unlinks what an earlier family left.
		flags |= os.O_CREATE | os.O_EXCL
		os.Remove(path)
	}
	f, err := os.OpenFile(path, flags|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		var errno syscall.Errno
		errors.As(err, &errno)
		releaseAssert(fmt.Sprintf("panic: cannot open shared memory region %s check user permissions. Error: %v",
			path[len("/dev/shm"):], errno))
	}
	defer f.Close()
	if epoch == 0 {
		if err := f.Truncate(shmSize); err != nil {
			return nil, fmt.Errorf("%w: shared memory %s: %v", errHotRestart, path, err)
		}
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, shmSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%w: shared memory %s: %v", errHotRestart, path, err)
	}
	s := &sharedMemory{mem: mem, flags: (*uint64)(unsafe.Pointer(&mem[shmFlagsOffset]))}
	if epoch == 0 {
		binary.NativeEndian.PutUint64(mem[0:], shmSize)
		binary.NativeEndian.PutUint64(mem[8:], shmVersion)
	} else {
		if binary.NativeEndian.Uint64(mem[0:]) != shmSize {
			releaseAssert("Hot restart SharedMemory size mismatch! You must have hot restarted into a not-hot-restart-compatible new version of Envoy.")
		}
		if binary.NativeEndian.Uint64(mem[8:]) != shmVersion {
			releaseAssert("Hot restart version mismatch! You must have hot restarted into a not-hot-restart-compatible new version of Envoy.")
		}
	}
	if old := atomic.OrUint64(s.flags, shmFlagInitializing); old&shmFlagInitializing != 0 {
		s.detach()
		return nil, fmt.Errorf("%w: previous envoy process is still initializing", errHotRestart)
	}
	return s, nil
}

// initialized clears INITIALIZING: a next epoch may start.
func (s *sharedMemory) initialized() { atomic.AndUint64(s.flags, ^uint64(shmFlagInitializing)) }

func (s *sharedMemory) detach() {
	if s != nil {
		unix.Munmap(s.mem)
	}
}

// abort ends the process by SIGABRT, as C's abort() in Envoy: with
// GOTRACEBACK=crash Go's SIGABRT handler dumps the goroutines (Envoy logs a
// backtrace) and then dies by the signal instead of exiting 2.
func abort() {
	debug.SetTraceback("crash")
	syscall.Kill(os.Getpid(), syscall.SIGABRT)
	select {}
}
