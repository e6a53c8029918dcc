package certs

import (
	"context"
	"testing"
	"time"

	pb "istio.io/api/security/v1alpha1"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/istioca"
)

// BenchmarkCSRRoundTrip: key generation (ECDSA P-256), CSR, CreateCertificate
// over TLS to the test CA, and the check of the answer.
func BenchmarkCSRRoundTrip(b *testing.B) {
	ca := istioca.Start(b, istioca.Options{Lifetime: time.Hour, Token: testToken})
	root := b.TempDir()
	cfg := testConfig(b, root)
	cfg.CAAddr, cfg.KeyAlgorithm = ca.Addr, ECDSA
	testkit.WriteFile(b, cfg.CARootFile, ca.Root.CertPEM)
	testkit.WriteFile(b, cfg.TokenFile, []byte(testToken))
	s := newService(b, cfg, &testkit.Recorder[messages.CertBundle]{}, &testkit.HealthRecorder{}, nil, nil, nil)
	conn, err := s.dialCA()
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := pb.NewIstioCertificateServiceClient(conn)
	if _, err := s.requestCertificate(context.Background(), client); err != nil { // connect
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.requestCertificate(context.Background(), client); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKeyGeneration measures ECDSA P-256 and RSA 2048 (Istio's default)
// key generation in the same run and reports RSA's cost as a multiple of
// ECDSA's.
func BenchmarkKeyGeneration(b *testing.B) {
	timeIt := func(alg KeyAlgorithm) time.Duration {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			if _, err := generateKey(KeySettings{Algorithm: alg, RSABits: 2048, Curve: "P256"}); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start) / time.Duration(b.N)
	}
	ec := timeIt(ECDSA)
	rsa := timeIt(RSA)
	b.ReportMetric(float64(ec.Nanoseconds()), "ecdsa_ns/key")
	b.ReportMetric(float64(rsa.Nanoseconds()), "rsa_ns/key")
	b.ReportMetric(float64(rsa)/float64(ec), "rsa/ecdsa")
}
