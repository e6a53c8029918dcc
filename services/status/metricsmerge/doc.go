// Package metricsmerge is the status server's merged Prometheus endpoint
// (/stats/prometheus and /metrics, as Istio's agent serves them): the
// agent's registry under Istio's istio_agent_ prefix, then Envoy's
// exposition, then the application's (ISTIO_PROMETHEUS_ANNOTATIONS), as one
// exposition in the format the caller asked for.
//
// It is a library of the status service, not a service: status serves
// Handler on its routes and closes its idle connections when it stops. It
// was part of package status until #26 put the merger apart from
// readiness: handler.go answers a scrape, sources.go asks and reads Envoy
// and the application, exposition.go, scan.go and merge.go parse, scan and
// merge expositions, and stream.go streams Envoy's answer and a long
// application answer into a text one (#36).
package metricsmerge
