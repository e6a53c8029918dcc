package identitye2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

// e2eWorkloadID is the identity of the file-mounted test certificates.
const e2eWorkloadID = "spiffe://cluster.local/ns/default/sa/e2e"

const testToken = "e2e-token"

// testCA implements IstioCertificateService over TLS on loopback.
type testCA struct {
	pb.UnimplementedIstioCertificateServiceServer
	issuer   *pki.CA
	lifetime time.Duration
	addr     string
}

func startTestCA(t testing.TB, lifetime time.Duration) *testCA {
	t.Helper()
	ca := &testCA{issuer: pki.NewRoot(t, "e2e root"), lifetime: lifetime}
	chain, key := ca.issuer.Leaf(t, pki.Leaf{SPIFFE: e2eWorkloadID, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	cert, err := tls.X509KeyPair(chain, key)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ca.addr = lis.Addr().String()
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})))
	pb.RegisterIstioCertificateServiceServer(srv, ca)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return ca
}

func (ca *testCA) CreateCertificate(ctx context.Context, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if a := md.Get("authorization"); len(a) != 1 || a[0] != "Bearer "+testToken {
		return nil, status.Error(codes.Unauthenticated, "e2e CA: bad token")
	}
	block, _ := pem.Decode([]byte(req.Csr))
	if block == nil {
		return nil, status.Error(codes.InvalidArgument, "CSR is not PEM")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if len(csr.URIs) != 1 {
		return nil, status.Error(codes.InvalidArgument, "CSR without one SPIFFE ID")
	}
	leaf := ca.issuer.Sign(panicOnFatal{}, csr.PublicKey, pki.Leaf{SPIFFE: csr.URIs[0].String(), Lifetime: ca.lifetime})
	return &pb.IstioCertificateResponse{CertChain: []string{string(leaf), string(ca.issuer.CertPEM)}}, nil
}

// panicOnFatal lets the server goroutine use the test kit's Sign, which
// fails only on a broken test PKI.
type panicOnFatal struct{}

func (panicOnFatal) Helper()           {}
func (panicOnFatal) Fatal(args ...any) { panic(fmt.Sprint(args...)) }
