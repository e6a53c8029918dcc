package capture

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// ErrValidation: the probe connection was not captured in time
// (istio-iptables exits 126 then).
var ErrValidation = errors.New("iptables validation failed: probe connection was not redirected")

// ValidateCapture checks capture end to end as Istio's validator does: listen on
// the proxy's outbound and inbound ports on loopback, dial the inbound
// passthrough address (127.0.0.6 / ::6) on the probe port every second, and
// succeed once a redirected connection arrives whose original destination
// port is the probe port. Run as the proxy UID, since only the proxy's
// loopback calls are redirected to the inbound port.
func ValidateCapture(ctx context.Context, cfg RulesConfig) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.ProbeTimeout)
	defer cancel()
	lo, dst := "127.0.0.1", "127.0.0.6"
	if cfg.HostIP.Is6() {
		lo, dst = "::1", "::6"
	}
	found := make(chan struct{}, 1)
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	done := make(chan struct{})
	defer func() { <-done }()
	accepting := 0
	for _, port := range []string{cfg.ProxyPort, cfg.InboundCapturePort} {
		ln, err := net.Listen("tcp", net.JoinHostPort(lo, port))
		if err != nil {
			close(done)
			return fmt.Errorf("validation listen %s: %w", port, err)
		}
		lns = append(lns, ln)
	}
	results := make(chan struct{}, len(lns))
	for _, ln := range lns {
		accepting++
		go func() {
			defer func() { results <- struct{}{} }()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if orig, err := OriginalDst(c); err == nil && orig.Port() == cfg.IptablesProbePort {
					select {
					case found <- struct{}{}:
					default:
					}
				}
				c.Close()
			}
		}()
	}
	go func() {
		for range accepting {
			<-results
		}
		close(done)
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	probe := net.JoinHostPort(dst, strconv.Itoa(int(cfg.IptablesProbePort)))
	for {
		d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: netip.MustParseAddr(lo).AsSlice()}}
		if c, err := d.DialContext(ctx, "tcp", probe); err == nil {
			c.Close()
		}
		select {
		case <-found:
			for _, ln := range lns {
				ln.Close()
			}
			return nil
		case <-ctx.Done():
			for _, ln := range lns {
				ln.Close()
			}
			return fmt.Errorf("%w (dialed %s for %s)", ErrValidation, probe, cfg.ProbeTimeout)
		case <-tick.C:
		}
	}
}
