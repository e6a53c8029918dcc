package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Hot restart between epochs of the stand-in (#25), as Envoy does it
// (source/server/hot_restart_impl.cc, hot_restarting_base.cc,
// hot_restarting_child.cc, hot_restarting_parent.cc, options_impl.cc,
// server.cc, drain_manager_impl.cc), so that an agent restarting Envoy by
// epochs is tested against Envoy's rules. Without --disable-hot-restart
// (with it, none of this: no socket, no shared memory, the epoch ignored):
//
//   - Sockets. Every process binds two unix datagram sockets, as a child and
//     as a parent: <socket-path>_child_<id> and <socket-path>_parent_<id>,
//     id = base-id*10 + epoch%3 (Envoy scales the base id by 10 and allows 3
//     concurrent processes, so epoch N+3 collides with a live epoch N).
//     --socket-path defaults to "@envoy_domain_socket": a leading '@' is the
//     abstract namespace (per network namespace, nothing on disk), named as
//     Envoy names it, padded with NULs to the whole sun_path; a path without
//     '@' is unlinked, bound and chmod-ed to --socket-mode (octal, default
//     600). A socket already bound (another process holds this epoch, or
//     epoch+-3, with this base id) fails the start: "unable to bind domain
//     socket with base_id=<base-id*10>, id=<epoch%3>, errno=98 (see --base-id
//     option)", exit 1.
//   - Shared memory. /dev/shm/envoy_shared_memory_<base-id*10>, Envoy's
//     layout (size, version, two mutexes, flags): epoch 0 removes and
//     creates it, a later epoch opens it (missing: abort, as Envoy's PANIC).
//     Every process sets its INITIALIZING flag at start and clears it once
//     initialised (when it tells its parent to drain, epoch 0 too). A process
//     that finds the flag already set fails: "previous envoy process is still
//     initializing", exit 1. As in Envoy, a process that dies before its
//     init completes leaves the flag set: every later epoch of this base id
//     then fails the same way until an epoch 0 starts afresh. Sockets and
//     shared memory are taken before the bootstrap is read (so a bootstrap
//     that does not load leaves the flag set too); --mode validate takes
//     neither.
//   - Epoch N > 0, the child of epoch N-1. After its bootstrap is loaded it
//     asks the parent to shut its admin down (the reply carries the first
//     epoch's start time: uptime_all_epochs); then it binds its own admin.
//     For every listener it binds (static HTTP listeners, capture listeners
//     from the bootstrap or LDS; not the admin, as in Envoy), when it opens
//     it (at start, or at the LDS update that adds it), it asks the parent
//     for the socket by address ("tcp://0.0.0.0:15001", "tcp://[::]:15001")
//     and receives the parent's listening fd by SCM_RIGHTS: the same socket
//     keeps accepting, so no connection is refused during the overlap; an
//     address the parent does not have is bound afresh. Once initialised
//     (its /ready would say LIVE: init done, FAKE_ENVOY_NEVER_READY and
//     FAKE_ENVOY_READY_AFTER honoured), its listeners open, it tells the
//     parent to drain its listeners and, --parent-shutdown-time-s later
//     (default 900), to terminate. It also terminates its parent first
//     when it shuts down itself (SIGTERM, SIGINT, /quitquitquit), as
//     Envoy's InstanceImpl::shutdown: SIGTERM to the newest epoch ends both.
//     Its /server_info has
//     "hot_restart_version": "11.104" ("disabled" with
//     --disable-hot-restart), "command_line_options" with "restart_epoch"
//     (a number), "base_id" (a string), "parent_shutdown_time", "drain_time",
//     "disable_hot_restart", "socket_path", and "uptime_all_epochs" counted
//     from epoch 0's start ("uptime_current_epoch" from its own).
//   - The parent. On shutdown_admin it stops its stats flushes, closes its
//     admin listener (so during the overlap only the newest epoch answers on
//     the admin port, as in Envoy) and terminates its own parent if that one
//     still runs ("terminating parent process"); on drain_listeners it stops accepting on every listener
//     (connections already accepted carry on; those still in the kernel's
//     queue are the child's), its state turns DRAINING (in its stats: its
//     admin is closed already); on
//     terminate it logs "shutting down due to child request" and sends
//     itself SIGTERM, so it exits 0 (or not at all with
//     FAKE_ENVOY_IGNORE_SIGTERM, as an Envoy stuck in shutdown).
//   - A parent that is gone: a datagram to its unbound socket is refused;
//     the child logs "hot restart sendmsg() connection refused, retrying",
//     retries 10 times a second apart (FAKE_ENVOY_HOT_RESTART_RETRY_DELAY
//     shortens the second) and then aborts (SIGABRT) with "hot restart
//     sendmsg() failed: returned -1, errno 111", as Envoy's RELEASE_ASSERT.
//     This holds for every message: a parent SIGKILLed during the overlap
//     makes the child abort when it next sends: the stats request of its
//     next stats flush (every stats_flush_interval, 5s by default, until it
//     has told the parent to terminate), drain, terminate, or a new LDS
//     listener's socket. With --skip-hot-restart-on-no-parent the child
//     first sends test_connection; refused, it logs "hot restart sendmsg()
//     connection refused, falling back to regular restart" and starts as an
//     epoch 0 would (keeping its epoch number and sockets). The other way
//     round too: a parent whose reply is refused (its child died in the
//     middle of an exchange) aborts.
//   - Every process asks PR_SET_PDEATHSIG=SIGTERM, as Envoy: when the
//     thread that started it exits, it gets SIGTERM.
//
// Simplified: messages are Envoy's framing (an 8-byte big-endian length,
// then the body, one datagram each) with a JSON body naming Envoy's
// HotRestartMessage fields instead of the protobuf; one socket per address
// (SO_REUSEPORT, but no per-worker sockets); no UDP forwarding socket (Envoy's
// <socket-path>_udp_* pair is not bound); the child waits at most 30s for a
// reply where Envoy can block for ever; and no stats cross epochs: the
// child asks for its parent's stats at each flush as Envoy does, but the
// reply carries none (no shared-memory stats, no hot_restart_generation):
// the child's stats start from zero, where Envoy's child merges its
// parent's.

// hotRestartVersion is Envoy's: HOT_RESTART_VERSION.sizeof(SharedMemory).
const hotRestartVersion = "11.104"

const (
	maxConcurrentProcesses = 3
	sendmsgMaxRetries      = 10
	replyTimeout           = 30 * time.Second
	maxDatagram            = 4096
)

// hrMessage is one hot restart message, Envoy's HotRestartMessage flattened:
// a request (Request) or a reply (Reply) of the named kind.
type hrMessage struct {
	Request string `json:"request,omitempty"` // shutdown_admin, pass_listen_socket, stats, drain_listeners, terminate, test_connection
	Reply   string `json:"reply,omitempty"`   // shutdown_admin, pass_listen_socket, stats
	// Address: pass_listen_socket's request ("tcp://ip:port").
	Address string `json:"address,omitempty"`
	// Fd: pass_listen_socket's reply, -1 when the parent has no such
	// socket; the descriptor itself travels as SCM_RIGHTS.
	Fd int `json:"fd,omitempty"`
	// OriginalStartTimeUnixSeconds: shutdown_admin's reply.
	OriginalStartTimeUnixSeconds int64 `json:"original_start_time_unix_seconds,omitempty"`
	DidntRecognize               bool  `json:"didnt_recognize_your_last_message,omitempty"`
}

// hotRestart is one process's half of the protocol: a child of epoch-1 and
// the parent of epoch+1.
type hotRestart struct {
	scaledBaseID          int
	retryDelay            time.Duration
	asChild, asParent     *net.UnixConn
	parentAddr, childAddr *net.UnixAddr
	shm                   *sharedMemory

	mu               sync.Mutex // one exchange with the parent at a time
	parentTerminated bool       // no parent, or told to terminate: nothing more is sent
	statsStopped     bool       // a child shut this process's admin down: no more stats flushes
}

var errHotRestart = errors.New("hot restart")

// socketName is Envoy's createDomainSocketAddress: an abstract name padded
// with NULs to the whole sun_path, as Envoy binds sizeof(sockaddr_un).
func socketName(path, role string, scaledBaseID, epoch int) string {
	name := fmt.Sprintf("%s_%s_%d", path, role, scaledBaseID+epoch%maxConcurrentProcesses)
	if strings.HasPrefix(path, "@") && len(name) < len(unix.RawSockaddrUnix{}.Path) {
		name += strings.Repeat("\x00", len(unix.RawSockaddrUnix{}.Path)-len(name))
	}
	return name
}

// newHotRestart binds this epoch's sockets and attaches the shared memory,
// in Envoy's order (child socket, parent socket, shared memory).
func newHotRestart(o *options, k knobs) (*hotRestart, error) {
	h := &hotRestart{scaledBaseID: o.baseID * 10, retryDelay: k.hotRestartRetryDelay, parentTerminated: o.restartEpoch == 0}
	if o.restartEpoch > 0 {
		h.parentAddr = &net.UnixAddr{Net: "unixgram", Name: socketName(o.socketPath, "parent", h.scaledBaseID, o.restartEpoch-1)}
	}
	h.childAddr = &net.UnixAddr{Net: "unixgram", Name: socketName(o.socketPath, "child", h.scaledBaseID, o.restartEpoch+1)}
	var err error
	if h.asChild, err = h.bind(o, "child"); err != nil {
		return nil, err
	}
	if h.asParent, err = h.bind(o, "parent"); err != nil {
		h.asChild.Close()
		return nil, err
	}
	if h.shm, err = attachSharedMemory(h.scaledBaseID, o.restartEpoch); err != nil {
		h.close()
		return nil, err
	}
	// Envoy: "If our parent ever goes away just terminate us".
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGTERM), 0, 0, 0); err != nil {
		log.Printf("warning: PR_SET_PDEATHSIG: %v", err)
	}
	return h, nil
}

func (h *hotRestart) bind(o *options, role string) (*net.UnixConn, error) {
	name := socketName(o.socketPath, role, h.scaledBaseID, o.restartEpoch)
	if !strings.HasPrefix(name, "@") {
		os.Remove(name) // Envoy unlinks before it binds
	}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Net: "unixgram", Name: name})
	if err != nil {
		var errno syscall.Errno
		errors.As(err, &errno)
		return nil, fmt.Errorf("%w: unable to bind domain socket with base_id=%d, id=%d, errno=%d (see --base-id option)",
			errHotRestart, h.scaledBaseID, o.restartEpoch%maxConcurrentProcesses, int(errno))
	}
	if !strings.HasPrefix(name, "@") {
		os.Chmod(name, os.FileMode(o.socketMode))
	}
	return c, nil
}

// close closes the sockets. The shared memory stays mapped until the
// process exits: a goroutine may still clear the flag.
func (h *hotRestart) close() {
	h.asChild.Close()
	h.asParent.Close()
}

// send is Envoy's sendHotRestartMessage: one datagram, retried while the
// peer refuses it; a peer still refusing after the retries aborts the
// process (Envoy's RELEASE_ASSERT). allowFailure (test_connection) returns
// false at the first refusal instead.
func send(from *net.UnixConn, to *net.UnixAddr, m hrMessage, oob []byte, retryDelay time.Duration, allowFailure bool) bool {
	body, err := json.Marshal(m)
	if err != nil {
		releaseAssert(fmt.Sprintf("failed to serialize a HotRestartMessage: %v", err))
	}
	buf := binary.BigEndian.AppendUint64(nil, uint64(len(body)))
	buf = append(buf, body...)
	var errno syscall.Errno
	for range sendmsgMaxRetries {
		_, _, err = from.WriteMsgUnix(buf, oob, to)
		if err == nil {
			return true
		}
		errno = 0
		errors.As(err, &errno)
		if errno != syscall.ECONNREFUSED {
			break
		}
		if allowFailure {
			return false
		}
		log.Printf("error: hot restart sendmsg() connection refused, retrying")
		time.Sleep(retryDelay)
	}
	releaseAssert(fmt.Sprintf("hot restart sendmsg() failed: returned -1, errno %d", int(errno)))
	return false
}

// receive reads one message and the descriptor passed with it, if any.
func receive(c *net.UnixConn, deadline time.Time) (hrMessage, int, error) {
	buf, oob := make([]byte, maxDatagram), make([]byte, unix.CmsgSpace(4))
	c.SetReadDeadline(deadline)
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return hrMessage{}, -1, err
	}
	fd := -1
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			releaseAssert("recvmsg() came with control data when the message's purpose was not to pass a file descriptor.")
		}
		fds, err := unix.ParseUnixRights(&msgs[0])
		if err != nil || len(fds) != 1 {
			releaseAssert("More than one control data on a single hot restart recvmsg().")
		}
		fd = fds[0]
	}
	var m hrMessage
	if n < 8 || uint64(n-8) != binary.BigEndian.Uint64(buf[:8]) || json.Unmarshal(buf[8:n], &m) != nil {
		releaseAssert("failed to parse a HotRestartMessage.")
	}
	return m, fd, nil
}

// exchange sends a request to the parent and waits for its reply of the
// same kind.
func (h *hotRestart) exchange(req hrMessage) (hrMessage, int, error) {
	send(h.asChild, h.parentAddr, req, nil, h.retryDelay, false)
	deadline := time.Now().Add(replyTimeout)
	for {
		m, fd, err := receive(h.asChild, deadline)
		if err != nil {
			return m, -1, fmt.Errorf("%w: no reply from the parent to %s: %v", errHotRestart, req.Request, err)
		}
		if m.Reply == req.Request {
			return m, fd, nil
		}
		if fd >= 0 {
			unix.Close(fd)
		}
		log.Printf("error: hot restart: unexpected message from the parent (%+v); ignoring", m)
	}
}

// shutdownParentAdmin is the child's first exchange: it returns the first
// epoch's start time, or zero when there is no parent to ask.
func (h *hotRestart) shutdownParentAdmin(skipOnNoParent bool) (time.Time, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.parentTerminated {
		return time.Time{}, nil
	}
	if skipOnNoParent && !send(h.asChild, h.parentAddr, hrMessage{Request: "test_connection"}, nil, h.retryDelay, true) {
		log.Printf("warning: hot restart sendmsg() connection refused, falling back to regular restart")
		h.parentTerminated = true
		return time.Time{}, nil
	}
	m, _, err := h.exchange(hrMessage{Request: "shutdown_admin"})
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(m.OriginalStartTimeUnixSeconds, 0), nil
}

// parentSocket is the parent's listening socket bound to addr, or nil when
// there is no parent or it has none (-1).
func (h *hotRestart) parentSocket(addr string) (*os.File, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.parentTerminated {
		return nil, nil
	}
	_, fd, err := h.exchange(hrMessage{Request: "pass_listen_socket", Address: addr})
	if err != nil || fd < 0 {
		return nil, err
	}
	log.Printf("obtained socket for address %s from parent", addr)
	return os.NewFile(uintptr(fd), addr), nil
}

// parentStats is a stats flush's request to the parent (its reply carries
// no stats); false once there is no parent to ask.
func (h *hotRestart) parentStats() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.parentTerminated || h.statsStopped {
		return false
	}
	if _, _, err := h.exchange(hrMessage{Request: "stats"}); err != nil {
		log.Printf("error: %v", err)
	}
	return true
}

// initialized is Envoy's drainParentListeners at workers started: the
// parent stops accepting, and a next epoch may now start.
func (h *hotRestart) initialized() {
	h.mu.Lock()
	if !h.parentTerminated {
		send(h.asChild, h.parentAddr, hrMessage{Request: "drain_listeners"}, nil, h.retryDelay, false)
	}
	h.mu.Unlock()
	h.shm.initialized()
}

// terminateParent tells the parent to exit (why: Envoy's log line);
// nothing more is sent to it. Envoy sends it after the parent shutdown
// time, when it gets a child of its own, and when it shuts down itself
// (SIGTERM, /quitquitquit): a parent already gone then makes it abort.
func (h *hotRestart) terminateParent(why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.parentTerminated {
		return
	}
	log.Printf("%s", why)
	send(h.asChild, h.parentAddr, hrMessage{Request: "terminate"}, nil, h.retryDelay, false)
	h.parentTerminated = true
}

// parentSide is what the parent half needs of the stand-in.
type parentSide interface {
	shutdownAdmin() time.Time             // closes the admin listener; the first epoch's start
	listenerFor(addr string) net.Listener // the bound listener at addr, or nil
	drainListeners()                      // stop accepting everywhere
}

// serveChild answers the child's requests until the socket is closed.
func (h *hotRestart) serveChild(p parentSide) {
	for {
		m, fd, err := receive(h.asParent, time.Time{})
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				log.Printf("error: hot restart: %v", err)
			}
			return
		}
		if fd >= 0 {
			unix.Close(fd)
		}
		reply := func(r hrMessage, oob []byte) { send(h.asParent, h.childAddr, r, oob, h.retryDelay, false) }
		switch m.Request {
		case "shutdown_admin":
			// Envoy's InstanceImpl::shutdownAdmin: no more stats flushes,
			// the admin closed, and a parent of its own still running is
			// terminated (so at most two epochs outlive a third's start).
			log.Printf("warning: shutting down admin due to child startup")
			h.mu.Lock()
			h.statsStopped = true
			h.mu.Unlock()
			first := p.shutdownAdmin()
			h.terminateParent("warning: terminating parent process")
			reply(hrMessage{Reply: m.Request, OriginalStartTimeUnixSeconds: first.Unix()}, nil)
		case "pass_listen_socket":
			h.passListenSocket(p.listenerFor(m.Address), reply)
		case "stats":
			reply(hrMessage{Reply: m.Request}, nil)
		case "drain_listeners":
			p.drainListeners()
		case "terminate":
			log.Printf("shutting down due to child request")
			syscall.Kill(os.Getpid(), syscall.SIGTERM)
		case "test_connection":
		default:
			log.Printf("error: child sent us an unfamiliar type of HotRestartMessage; ignoring.")
			reply(hrMessage{DidntRecognize: true}, nil)
		}
	}
}

// passListenSocket replies with ln's descriptor, or -1 without one.
func (h *hotRestart) passListenSocket(ln net.Listener, reply func(hrMessage, []byte)) {
	sc, ok := ln.(syscall.Conn)
	if !ok || control(sc, func(fd int) error {
		reply(hrMessage{Reply: "pass_listen_socket", Fd: fd}, unix.UnixRights(fd))
		return nil
	}) != nil {
		// None, or closed meanwhile (drained): Envoy has no socket to pass then.
		reply(hrMessage{Reply: "pass_listen_socket", Fd: -1}, nil)
	}
}

// listenKey is how a listener's address is asked for: Envoy's
// "tcp://<ip>:<port>", the address normalised.
func listenKey(addr string) string {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		addr = ap.String()
	}
	return "tcp://" + addr
}

// releaseAssert is Envoy's RELEASE_ASSERT: log and abort, the process
// killed by SIGABRT.
func releaseAssert(details string) {
	log.Printf("critical: assert failure: false. Details: %s", details)
	abort()
}
