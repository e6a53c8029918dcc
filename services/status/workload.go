package status

import (
	"context"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/status/appprobe"
)

// The workload probe is the readiness probe the control plane configures
// for a VM workload (WorkloadGroup.probe, delivered as
// ProxyConfig.readinessProbe; appprobe.WorkloadProbe). The status server
// runs it and reports transitions upstream (Istio's HealthInformation,
// issue 13), so that istiod can take an unhealthy VM out of its service's
// endpoints. Istio: pkg/istio-agent/health.

// workloadVerdict is the last WorkloadHealth sent. It lives in the Service
// so that a restart of the status service does not send it again.
type workloadVerdict struct {
	sent    bool
	healthy bool
}

// runWorkloadProbe probes every Period after InitialDelay and sends
// WorkloadHealth when the verdict changes: after SuccessThreshold
// consecutive successes or FailureThreshold consecutive failures, as
// Istio's PerformApplicationHealthCheck. It returns when ctx is done.
func (s *Service) runWorkloadProbe(ctx context.Context) {
	wp := s.cfg.Probes.Workload
	s.log.Info("workload readiness probe starting", "probe", s.prober.Describe(wp), "initial_delay", wp.InitialDelay)
	select {
	case <-ctx.Done():
		return
	case <-s.clock.After(wp.InitialDelay):
	}
	successes, failures := 0, 0
	for {
		healthy, reason := s.probeWorkload(ctx, wp)
		if ctx.Err() != nil {
			return
		}
		if healthy {
			successes, failures = successes+1, 0
			if successes >= wp.SuccessThreshold {
				s.sendWorkloadHealth(true, "")
			}
		} else {
			successes, failures = 0, failures+1
			if failures >= wp.FailureThreshold {
				s.sendWorkloadHealth(false, reason)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(wp.Period):
		}
	}
}

func (s *Service) sendWorkloadHealth(healthy bool, reason string) {
	if s.workload.sent && s.workload.healthy == healthy {
		return
	}
	s.workload = workloadVerdict{sent: true, healthy: healthy}
	if healthy {
		s.log.Info("workload is healthy by its readiness probe")
	} else {
		s.log.Warn("workload is unhealthy by its readiness probe", "reason", reason)
	}
	if s.out.WorkloadHealth != nil {
		s.out.WorkloadHealth.Send(messages.WorkloadHealth{Healthy: healthy, Reason: reason})
	}
}

// probeWorkload runs the probe once. Envoy must be ready first when the
// agent runs one, as Istio puts its Envoy readiness check before the
// application's (health.EnvoyProber in the AggregateProber).
func (s *Service) probeWorkload(ctx context.Context, wp *appprobe.WorkloadProbe) (bool, string) {
	if s.in.RequireEnvoy {
		st, ok := s.in.Envoy.Get()
		if !ok || st.Phase != messages.EnvoyReady {
			return false, "envoy is not ready (" + st.Phase.String() + ")"
		}
	}
	healthy, reason := s.prober.Check(ctx, wp)
	return healthy, oneLine(reason)
}
