package tree

import (
	"log/slog"

	"github.com/thejerf/suture/v4"

	"github.com/meshagent/meshagent/messages"
)

// eventHook turns suture's events into log lines, counters and Health. It
// runs on a supervisor's goroutine, so it must never block: logging,
// counters and Stream.Send are all non-blocking.
//
// Failures and panics of our own services are already reported by their
// runners (which know the attempt and the next delay); what reaches here
// are the supervisor-level events.
func eventHook(log *slog.Logger, reporterOf func(name string) *messages.Reporter, m *metrics) suture.EventHook {
	return func(e suture.Event) {
		switch ev := e.(type) {
		case suture.EventStopTimeout:
			log.Warn("service did not stop in time", "supervisor", ev.SupervisorName, "service", ev.ServiceName)
			if r := reporterOf(ev.ServiceName); r != nil {
				r.Report(messages.Failed, "did not stop within the supervisor's timeout")
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
