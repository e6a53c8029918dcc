package compliance

import (
	"crypto/fips140"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// handshake dials a loopback TLS server configured by server with a client
// under policy p, and returns the client's view of the connection.
func handshake(t *testing.T, p Policy, server func(*tls.Config)) (tls.ConnectionState, error) {
	t.Helper()
	ca := pki.NewRoot(t, "compliance-test")
	sc := ca.ServerTLS(t, "localhost")
	if server != nil {
		server(sc)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", sc)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.(*tls.Conn).Handshake()
	}()
	cc := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}
	p.Apply(cc)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", ln.Addr().String(), cc)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer conn.Close()
	return conn.ConnectionState(), nil
}

func classicalCurves(c *tls.Config) {
	c.CurvePreferences = []tls.CurveID{tls.X25519, tls.CurveP256, tls.CurveP384}
}

// pqc: Istio's post-quantum key exchange or nothing. A server offering
// only classical curves is refused; a server offering X25519MLKEM768 (Go's
// default) is reached with it.
func TestPQCRefusesClassicalOnlyServer(t *testing.T) {
	if _, err := handshake(t, PQC, classicalCurves); err == nil {
		t.Fatal("pqc client completed a handshake with a classical-only server")
	}
	st, err := handshake(t, PQC, nil)
	if err != nil {
		t.Fatalf("pqc client to a default server: %v", err)
	}
	if st.Version != tls.VersionTLS13 || st.CurveID != tls.X25519MLKEM768 {
		t.Fatalf("pqc handshake: version %x, curve %v; want TLS 1.3 with X25519MLKEM768", st.Version, st.CurveID)
	}
	// TLS 1.2 is refused too.
	if _, err := handshake(t, PQC, func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12 }); err == nil {
		t.Fatal("pqc client completed a TLS 1.2 handshake")
	}
}

// Without a policy the same classical-only server is reached: the refusal
// above is the policy's.
func TestNoPolicyReachesClassicalServer(t *testing.T) {
	if _, err := handshake(t, None, classicalCurves); err != nil {
		t.Fatalf("no policy, classical server: %v", err)
	}
}

// fips-140-2: TLS 1.2 only, Istio's four suites, P-256.
func TestFIPS1402(t *testing.T) {
	st, err := handshake(t, FIPS1402, nil)
	if err != nil {
		t.Fatalf("fips-140-2 to a default server: %v", err)
	}
	if st.Version != tls.VersionTLS12 || st.CipherSuite != tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 || st.CurveID != tls.CurveP256 {
		t.Fatalf("fips-140-2: version %x suite %s curve %v; want TLS 1.2, ECDHE-ECDSA-AES128-GCM-SHA256, P-256",
			st.Version, tls.CipherSuiteName(st.CipherSuite), st.CurveID)
	}
	if _, err := handshake(t, FIPS1402, func(c *tls.Config) { c.MinVersion = tls.VersionTLS13 }); err == nil {
		t.Fatal("fips-140-2 client completed a handshake with a TLS 1.3-only server")
	}
	if _, err := handshake(t, FIPS1402, func(c *tls.Config) {
		c.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256}
	}); err == nil {
		t.Fatal("fips-140-2 client accepted ChaCha20-Poly1305")
	}
}

// fips-140-3: TLS 1.2 or 1.3, P-256 or P-384 only.
func TestFIPS1403(t *testing.T) {
	st, err := handshake(t, FIPS1403, nil)
	if err != nil {
		t.Fatalf("fips-140-3 to a default server: %v", err)
	}
	if st.Version != tls.VersionTLS13 || st.CurveID != tls.CurveP256 {
		t.Fatalf("fips-140-3: version %x curve %v; want TLS 1.3 over P-256", st.Version, st.CurveID)
	}
	if _, err := handshake(t, FIPS1403, func(c *tls.Config) { c.CurvePreferences = []tls.CurveID{tls.X25519} }); err == nil {
		t.Fatal("fips-140-3 client completed an X25519-only handshake")
	}
}

func TestParse(t *testing.T) {
	for _, v := range []string{"", "fips-140-2", "fips-140-3", "pqc"} {
		if p, err := Parse(v); err != nil || string(p) != v {
			t.Errorf("Parse(%q) = %q, %v", v, p, err)
		}
	}
	for _, v := range []string{"fips", "FIPS-140-2", "pqc ", "fips-140-4"} {
		if _, err := Parse(v); !errors.Is(err, ErrUnknown) {
			t.Errorf("Parse(%q) = %v; want ErrUnknown", v, err)
		}
	}
}

// fips-140-3 warns, as Istio's agent does, unless Go runs in FIPS 140-3
// mode; the other policies never do.
func TestWarning(t *testing.T) {
	for _, p := range []Policy{None, FIPS1402, PQC} {
		if w := p.Warning(); w != "" {
			t.Errorf("%q warns %q", p, w)
		}
	}
	if w := FIPS1403.Warning(); (w == "") != fips140.Enabled() {
		t.Errorf("fips-140-3 with fips140.Enabled()=%v warns %q", fips140.Enabled(), w)
	}
}
