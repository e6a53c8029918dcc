//go:build !disable_pgv

package bootstrap

import bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

// checkEnvoyRules applies Envoy's validation rules (the protoc-gen-validate
// annotations of its API, the checks Envoy itself runs when it loads a
// bootstrap) to a rendered user template, so that a value Envoy would
// refuse is an error naming the template before Envoy is started.
//
// `make build` leaves the rules out (go-control-plane's disable_pgv tag; see
// rules_off.go); go build, go test and go vet keep them.
func checkEnvoyRules(b *bootstrapv3.Bootstrap) error {
	return b.ValidateAll()
}
