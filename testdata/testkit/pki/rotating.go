package pki

import (
	"crypto/tls"
	"sync/atomic"
)

// ServerCert is a server's certificate that a test reissues from another
// CA while the server runs (a trust-root rotation): connections made after
// Issue get the new certificate, and those already open keep theirs. A
// handshake that succeeds after Issue therefore proves the client trusted
// the new root.
type ServerCert struct {
	hosts []string
	cur   atomic.Pointer[tls.Certificate]
}

// NewServerCert is a certificate for hosts (names or IPs) issued by ca.
func NewServerCert(t T, ca *CA, hosts ...string) *ServerCert {
	t.Helper()
	s := &ServerCert{hosts: hosts}
	s.Issue(t, ca)
	return s
}

// Issue replaces the certificate with one for the same hosts from ca.
func (s *ServerCert) Issue(t T, ca *CA) {
	t.Helper()
	c := ca.ServerTLS(t, s.hosts...).Certificates[0]
	s.cur.Store(&c)
}

// TLS is a server configuration that presents the current certificate.
func (s *ServerCert) TLS() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cur.Load(), nil },
	}
}
