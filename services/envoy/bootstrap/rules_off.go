//go:build disable_pgv

package bootstrap

import bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

// checkEnvoyRules, in a build with go-control-plane's disable_pgv tag (`make
// build`), leaves Envoy's rules to Envoy, which applies the same ones when it
// loads the bootstrap, as it does behind Istio's agent, which checks nothing
// of its template's output. The rules cost 6.6 MB of the binary (#36): they
// are generated Validate methods of every Envoy API type the agent links,
// and the linker keeps every exported method of those types because
// text/template, which user templates need, looks methods up by name.
// What remains of the check is protojson's: syntax, known fields, types.
func checkEnvoyRules(*bootstrapv3.Bootstrap) error {
	return nil
}
