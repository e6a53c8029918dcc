package sds

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/messages"
)

// SecretTypeURL is the type of every resource this server sends.
const SecretTypeURL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

// checkName rejects a name this server cannot serve, naming it and the ones
// it can: Envoy shows the gRPC status in its logs, and a silent wait would
// leave a listener warming for ever.
func checkName(name string) error {
	if name == WorkloadKeyCertResourceName || name == RootCertResourceName {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "unknown secret %q: this SDS server serves only %q (workload certificate) and %q (trusted roots)",
		name, WorkloadKeyCertResourceName, RootCertResourceName)
}

func checkTypeURL(typeURL string) error {
	if typeURL == "" || typeURL == SecretTypeURL {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "unsupported type_url %q: this SDS server serves only %s", typeURL, SecretTypeURL)
}

// resourceVersion is the version of one secret within a bundle: the
// workload certificate changes with every bundle; the roots only when the
// roots do, so that a ROOTCA subscriber is not pushed for a renewal.
func resourceVersion(name string, b messages.CertBundle) string {
	if name == RootCertResourceName {
		sum := sha256.Sum256(b.RootsPEM)
		return "roots-" + hex.EncodeToString(sum[:8])
	}
	return b.Version
}

// secret builds the named secret from b (name already checked).
func secret(name string, b messages.CertBundle) (*anypb.Any, error) {
	inline := func(p []byte) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: p}}
	}
	s := &tlsv3.Secret{Name: name}
	if name == RootCertResourceName {
		s.Type = &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: inline(b.RootsPEM),
		}}
	} else {
		s.Type = &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(b.CertChainPEM),
			PrivateKey:       inline(b.KeyPEM),
		}}
	}
	a, err := anypb.New(s)
	if err != nil {
		return nil, fmt.Errorf("marshal secret %q: %w", name, err)
	}
	return a, nil
}
