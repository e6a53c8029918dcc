package sds

import (
	"fmt"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/meshagent/meshagent/messages"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// SecretTypeURL is the type of every resource this server sends.
const SecretTypeURL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

// secretState is one resource as the store last computed it. The store
// publishes these in a view; streams only read them.
type secretState struct {
	// secret is the last good secret, nil if there never was one. It is
	// kept when a later read fails: Envoy keeps what it has on a bad
	// update, and a new stream (a restarted Envoy) gets the same.
	secret  *anypb.Any
	version string
	// err says why the resource cannot be served as it is now: a gRPC
	// status naming the resource (and the file, for file secrets). Nil
	// when secret is current.
	err error
}

// key changes whenever a stream has something new to tell about the
// resource: a new secret, or a new (or cleared) error.
func (s secretState) key() string {
	if s.err != nil {
		return s.version + "\x00" + s.err.Error()
	}
	return s.version
}

// view is every resource the store can answer for, by name: what it
// publishes on each change. A published view is never modified.
type view map[string]secretState

func checkTypeURL(typeURL string) error {
	if typeURL == "" || typeURL == SecretTypeURL {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "unsupported type_url %q: this SDS server serves only %s", typeURL, SecretTypeURL)
}

func inline(p []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: p}}
}

// tlsCertificateSecret is a certificate chain and private key, inline.
func tlsCertificateSecret(name string, chainPEM, keyPEM []byte) (*anypb.Any, error) {
	return marshalSecret(&tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: inline(chainPEM),
		PrivateKey:       inline(keyPEM),
	}}})
}

// validationSecret is trusted CAs and, if crlPEM is not empty, a CRL, inline.
// Istio names the CRL file (DataSource filename) and leaves the reading to
// Envoy, whose own file watch only sees renames; sending the content means
// Envoy gets the CRL this server checked, and a changed CRL is a push.
func validationSecret(name string, rootsPEM, crlPEM []byte) (*anypb.Any, error) {
	vc := &tlsv3.CertificateValidationContext{TrustedCa: inline(rootsPEM)}
	if len(crlPEM) > 0 {
		vc.Crl = inline(crlPEM)
	}
	return marshalSecret(&tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{ValidationContext: vc}})
}

func marshalSecret(s *tlsv3.Secret) (*anypb.Any, error) {
	a, err := anypb.New(s)
	if err != nil {
		return nil, fmt.Errorf("marshal secret %q: %w", s.Name, err)
	}
	return a, nil
}

// responseVersion is a SotW response's version_info: the version of its one
// resource, or a hash of every name and version it carries.
func responseVersion(names []string, states map[string]secretState) string {
	if len(names) == 1 {
		return states[names[0]].version
	}
	sorted := slices.Sorted(slices.Values(names))
	var b strings.Builder
	for _, n := range sorted {
		fmt.Fprintf(&b, "%s=%s;", n, states[n].version)
	}
	return messages.ContentVersion([]byte(b.String()))
}
