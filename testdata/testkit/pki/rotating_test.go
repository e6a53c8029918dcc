package pki

import (
	"crypto/tls"
	"testing"

	"github.com/meshagent/meshagent/testdata/testkit"
)

// A reissued server certificate is presented to the next connection: a
// client trusting the old root alone then fails, one trusting the new root
// succeeds.
func TestServerCertIssue(t *testing.T) {
	a, b := NewRoot(t, "root-a"), NewRoot(t, "root-b")
	s := NewServerCert(t, a, "127.0.0.1")
	l, err := tls.Listen("tcp", "127.0.0.1:0", s.TLS())
	if err != nil {
		t.Fatal(err)
	}
	testkit.AcceptAndClose(t, l)
	dial := func(ca *CA) error {
		c, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(a); err != nil {
		t.Fatalf("before the reissue, trusting root-a: %v", err)
	}
	s.Issue(t, b)
	if err := dial(a); err == nil {
		t.Fatal("after the reissue, a client trusting only root-a connected")
	}
	if err := dial(b); err != nil {
		t.Fatalf("after the reissue, trusting root-b: %v", err)
	}
}
