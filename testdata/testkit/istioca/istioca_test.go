package istioca

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/pki"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// request asks c for a certificate for the workload ID, with token.
func request(t *testing.T, c *CA, token string) (*pb.IstioCertificateResponse, error) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.Root.CertPEM)
	conn, err := grpc.NewClient(c.Addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	u, _ := url.Parse(pki.WorkloadID)
	der, err := x509.CreateCertificateRequest(nil, &x509.CertificateRequest{URIs: []*url.URL{u}}, pki.NewKey(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token, "clusterid", "Kubernetes")
	return pb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &pb.IstioCertificateRequest{
		Csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), ValidityDuration: 600})
}

// The kit's CA signs with the root it wrote before starting, counts what it
// sees, refuses a wrong token, and comes back on its address after Stop.
func TestCA(t *testing.T) {
	c := New(t, Options{Lifetime: time.Hour, Token: "good"})
	c.Start(t)
	resp, err := request(t, c, "good")
	if err != nil {
		t.Fatal(err)
	}
	if last := resp.CertChain[len(resp.CertChain)-1]; last != string(c.Root.CertPEM) {
		t.Errorf("the chain does not end with the kit's root")
	}
	if _, err := request(t, c, "bad"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a bad token: %v", err)
	}
	if c.Issued(t) != 1 || c.Requests(t) != 2 {
		t.Errorf("issued %d of %d requests; want 1 of 2", c.Issued(t), c.Requests(t))
	}
	c.Logs.WaitLine(t, "certificate issued", "cluster_id=Kubernetes", "requested=10m0s")

	c.Stop(t)
	if _, err := request(t, c, "good"); status.Code(err) != codes.Unavailable {
		t.Errorf("a stopped CA answered: %v", err)
	}
	c.Start(t)
	if _, err := request(t, c, "good"); err != nil {
		t.Fatalf("after a restart on %s: %v", c.Addr, err)
	}
	if !strings.HasPrefix(c.Addr, "127.0.0.1:") {
		t.Errorf("address %s", c.Addr)
	}
}
