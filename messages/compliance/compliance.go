// Package compliance is Istio's COMPLIANCE_POLICY (#35): the policies the
// claimed Istio version knows, read once by the config, and what each one
// does to the agent's own TLS (the CA client and the XDS upstream), as
// Istio's EnforceGoCompliance does to every gRPC client it dials
// (pkg/model/fips.go, called from pilot/pkg/grpc/tls.go, which both
// security/pkg/nodeagent/caclient/providers/citadel and
// pkg/istio-agent/xds_proxy.go dial through). Envoy's side of the policy is
// its bootstrap's (services/envoy/bootstrap).
package compliance

import (
	"crypto/fips140"
	"crypto/tls"
	"errors"
	"fmt"
)

// Policy is a value of COMPLIANCE_POLICY.
type Policy string

// The policies of Istio's pkg/features/security.go at the version claimed:
// no others exist there.
const (
	// None places no restriction (COMPLIANCE_POLICY unset or empty).
	None Policy = ""
	// FIPS1402: TLS 1.2 only, the four ECDHE AES-GCM suites, P-256.
	FIPS1402 Policy = "fips-140-2"
	// FIPS1403: TLS 1.2 or 1.3, the same TLS 1.2 suites, P-256 or P-384.
	FIPS1403 Policy = "fips-140-3"
	// PQC: TLS 1.3 only, with the post-quantum key exchange
	// X25519MLKEM768 as the only key exchange (Istio: experimental).
	PQC Policy = "pqc"
)

// ErrUnknown is a value Istio's version does not know. Istio logs a
// warning and applies nothing; the agent refuses to start instead, since a
// policy asked for and silently not applied is the failure a compliance
// setting exists to prevent.
var ErrUnknown = errors.New("unknown compliance policy")

// Parse reads a value of COMPLIANCE_POLICY.
func Parse(s string) (Policy, error) {
	switch p := Policy(s); p {
	case None, FIPS1402, FIPS1403, PQC:
		return p, nil
	}
	return None, fmt.Errorf("%w %q: want %s, %s or %s (or empty)", ErrUnknown, s, FIPS1402, FIPS1403, PQC)
}

// fipsSuites are Istio's fipsGoCiphers: the TLS 1.2 suites both FIPS
// policies allow.
var fipsSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
}

// Apply sets c's versions, suites and curves to the policy's, over
// whatever c had: Istio applies it last, as the policy overrides every
// other setting. None leaves c as it is.
//
// Go does not let TLS 1.3's suites be chosen (CipherSuites is TLS 1.2's):
// under fips-140-3 and pqc, TLS 1.3 uses Go's AES-GCM and ChaCha20 suites
// unless the binary runs with GODEBUG=fips140=only, as in Istio.
func (p Policy) Apply(c *tls.Config) {
	switch p {
	case FIPS1402:
		c.MinVersion, c.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
		c.CipherSuites = fipsSuites
		c.CurvePreferences = []tls.CurveID{tls.CurveP256}
	case FIPS1403:
		c.MinVersion, c.MaxVersion = tls.VersionTLS12, tls.VersionTLS13
		c.CipherSuites = fipsSuites
		c.CurvePreferences = []tls.CurveID{tls.CurveP256, tls.CurveP384}
	case PQC:
		// Istio sets no maximum here (Go's is 1.3) and lists the TLS 1.3
		// AES-GCM suites, which Go ignores for 1.3.
		c.MinVersion = tls.VersionTLS13
		c.CipherSuites = []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384}
		c.CurvePreferences = []tls.CurveID{tls.X25519MLKEM768}
	}
}

// EnvoyEnv is what the policy adds to Envoy's environment: under both FIPS
// policies Istio limits the TLS 1.2 suites of Envoy's google_grpc clients
// to the four FIPS ones through GRPC_SSL_CIPHER_SUITES (pkg/envoy/proxy.go
// Run); pqc and None add nothing.
func (p Policy) EnvoyEnv() []string {
	if p != FIPS1402 && p != FIPS1403 {
		return nil
	}
	return []string{"GRPC_SSL_CIPHER_SUITES=ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384"}
}

// Warning is what Istio's agent warns of for the policy at start, "" if
// nothing: under fips-140-3 without Go's FIPS 140-3 mode
// (GODEBUG=fips140=only, or on), TLS 1.3's suites are not restricted.
func (p Policy) Warning() string {
	if p != FIPS1403 || fips140.Enabled() {
		return ""
	}
	return "COMPLIANCE_POLICY is fips-140-3 but Go's FIPS 140-3 mode is not enabled: TLS 1.3 cipher suites " +
		"are not restricted to FIPS-approved algorithms; set GODEBUG=fips140=only for full FIPS 140-3 compliance"
}
