package tree

import (
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier speaks systemd's sd_notify protocol.
type Notifier interface {
	// Notify sends a state line such as "READY=1".
	Notify(state string) error
	// WatchdogInterval is systemd's WATCHDOG_USEC, or 0 when the watchdog
	// is off.
	WatchdogInterval() time.Duration
}

// SystemdNotifier notifies the socket named by NOTIFY_SOCKET; without it
// every call is a no-op.
type SystemdNotifier struct{}

func (SystemdNotifier) Notify(state string) error {
	_, err := daemon.SdNotify(false, state)
	return err
}

func (SystemdNotifier) WatchdogInterval() time.Duration {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0
	}
	return d
}

type nopNotifier struct{}

func (nopNotifier) Notify(string) error             { return nil }
func (nopNotifier) WatchdogInterval() time.Duration { return 0 }
