// Package appprobe probes the application for the status server, as
// Istio's agent does: kubelet's probes that the injector rewrote to the
// status server (/app-health/..., /app-lifecycle/..., from
// ISTIO_KUBE_APP_PROBERS), sent from 127.0.0.6 so that capture lets them
// through, and the VM's readiness probe (ProxyConfig.readinessProbe,
// WorkloadProbe), run once per Check.
//
// It is a library of the status service, not a service: status serves
// Prober on its routes, runs the workload probe's loop (its clock, its
// WorkloadHealth output, Envoy's readiness first) and closes the prober's
// idle connections when it stops. It was part of package status until #26
// put the application probes apart from readiness.
package appprobe
