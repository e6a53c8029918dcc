// Package bootstrap builds Envoy's bootstrap the way Istio's pilot-agent
// does: the node (its id, cluster and metadata, from the pod's environment,
// Downward API files and ProxyConfig), then the built-in bootstrap, a user
// template (ISTIO_BOOTSTRAP, --templateFile, proxyBootstrapTemplatePath) or a
// custom config file used as is, and the override for --config-yaml
// (ISTIO_BOOTSTRAP_OVERRIDE).
//
// It is a library, not a service: the envoy service renders the bootstrap
// before Envoy's first start (Render) and writes the same bytes again before
// each restart (Rendered.Rewrite); cmd uses the node helpers (NodeID, AllIPv6,
// ReadDownwardAPI) for the values other services share with
// the bootstrap. It was part of package envoy until #26 put the 2.4 k lines
// that build a file apart from the ones that run a process.
//
// Config is filled by cmd with every value (Istio's defaults are in cmd's
// table) and validated once (Config.Validate, in envoy.New; Render trusts
// its caller).
package bootstrap
