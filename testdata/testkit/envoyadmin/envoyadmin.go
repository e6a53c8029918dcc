// Package envoyadmin is, for tests, the one decoder of Envoy's admin
// /config_dump: cmd/meshagent/envoyadmin, which `meshagent proxy-config`
// uses too (issue 22). These names keep the tests' imports short and
// stable; there is no second copy.
package envoyadmin

import "github.com/meshagent/meshagent/cmd/meshagent/envoyadmin"

// Dump is a decoded /config_dump.
type Dump = envoyadmin.Dump

// Resolver resolves every type URL, unknown ones as empty messages.
var Resolver = envoyadmin.Resolver

// Decode reads a /config_dump body.
func Decode(body []byte) (*Dump, error) { return envoyadmin.Decode(body) }
