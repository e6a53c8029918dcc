package tree

import (
	"log/slog"

	"github.com/thejerf/suture/v4"
)

// eventHook turns suture's events into log lines, counters and Health. It
// runs on a supervisor's goroutine, so it must never block: logging,
// counters and Stream.Send are all non-blocking.
//
// Failures and panics of our own services are already reported by their
// runners (which know the attempt and the next delay); what reaches here
// are the supervisor-level events.
func eventHook(log *slog.Logger, runnerOf func(name string) *runner, m *metrics) suture.EventHook {
	return func(e suture.Event) {
		switch ev := e.(type) {
		case suture.EventStopTimeout:
			// Every child of our supervisors is a runner: it counts the
			// overrun, shows it in /debug/tree and Health, and keeps the
			// service from being run again before the old run returns.
			if r := runnerOf(ev.ServiceName); r != nil {
				r.stopTimedOut(ev.SupervisorName)
			} else {
				log.Error("service did not stop in time", "supervisor", ev.SupervisorName, "service", ev.ServiceName)
			}
		case suture.EventServicePanic:
			// Only a panic outside a runner (in the tree itself) gets here.
			m.panics.WithLabelValues(ev.ServiceName).Inc()
			log.Error("panic in supervisor", "supervisor", ev.SupervisorName, "service", ev.ServiceName,
				"panic", ev.PanicMsg, "stack", ev.Stacktrace)
		case suture.EventBackoff:
			log.Warn("supervisor backing off", "supervisor", ev.SupervisorName)
		case suture.EventResume:
			log.Info("supervisor resuming", "supervisor", ev.SupervisorName)
		case suture.EventServiceTerminate:
			log.Debug("service terminated", "supervisor", ev.SupervisorName, "service", ev.ServiceName,
				"restarting", ev.Restarting, "error", ev.Err)
		}
	}
}
