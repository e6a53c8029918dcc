package identitye2e

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"
)

// testPKI is a root CA made in the test with crypto/x509.
type testPKI struct {
	root    *x509.Certificate
	rootKey crypto.Signer
	rootPEM []byte
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{Organization: []string{"e2e root"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := x509.ParseCertificate(der)
	return &testPKI{root: root, rootKey: key, rootPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (p *testPKI) issue(pub crypto.PublicKey, lifetime time.Duration, uris []*url.URL, ips []net.IP) ([]byte, error) {
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, NotBefore: now, NotAfter: now.Add(lifetime), URIs: uris, IPAddresses: ips,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.root, pub, p.rootKey)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// leaf returns a certificate chain and its PKCS#8 key, both PEM.
func (p *testPKI) leaf(t testing.TB, ips ...net.IP) (chainPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	id, _ := url.Parse("spiffe://cluster.local/ns/default/sa/e2e")
	chain, err := p.issue(key.Public(), time.Hour, []*url.URL{id}, ips)
	if err != nil {
		t.Fatal(err)
	}
	return chain, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// crl is a PEM CRL from the root, revoking one made-up serial.
func (p *testPKI) crl(t testing.TB) []byte {
	t.Helper()
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number: big.NewInt(1), ThisUpdate: time.Now().Add(-time.Minute), NextUpdate: time.Now().Add(time.Hour),
		RevokedCertificateEntries: []x509.RevocationListEntry{{SerialNumber: big.NewInt(4242), RevocationTime: time.Now().Add(-time.Minute)}},
	}, p.root, p.rootKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der})
}

const testToken = "e2e-token"

// testCA implements IstioCertificateService over TLS on loopback.
type testCA struct {
	pb.UnimplementedIstioCertificateServiceServer
	pki      *testPKI
	lifetime time.Duration
	addr     string
}

func startTestCA(t testing.TB, lifetime time.Duration) *testCA {
	t.Helper()
	ca := &testCA{pki: newTestPKI(t), lifetime: lifetime}
	chain, key := ca.pki.leaf(t, net.IPv4(127, 0, 0, 1))
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
	leaf, err := ca.pki.issue(csr.PublicKey, ca.lifetime, csr.URIs, nil)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &pb.IstioCertificateResponse{CertChain: []string{string(leaf), string(ca.pki.rootPEM)}}, nil
}
