package capture

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h).
const ip6tSOOriginalDst = 80

// OriginalDst returns the destination a REDIRECTed TCP connection had
// before NAT (SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST).
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	local := tc.LocalAddr().(*net.TCPAddr)
	var ap netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		if local.IP.To4() != nil {
			var sa unix.RawSockaddrInet4
			size := uint32(unsafe.Sizeof(sa))
			serr = getsockopt(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), &size)
			port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
			ap = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port)
			return
		}
		var sa unix.RawSockaddrInet6
		size := uint32(unsafe.Sizeof(sa))
		serr = getsockopt(int(fd), unix.SOL_IPV6, ip6tSOOriginalDst, unsafe.Pointer(&sa), &size)
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
		ap = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), port)
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	return ap, serr
}

func getsockopt(fd, level, name int, val unsafe.Pointer, size *uint32) error {
	_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(name),
		uintptr(val), uintptr(unsafe.Pointer(size)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}
