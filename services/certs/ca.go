package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/boundedfile"
	"github.com/meshagent/meshagent/services/internal/clientcert"
)

// ErrShortChain: the CA must return the leaf and, last, the root.
var ErrShortChain = errors.New("CA response cert_chain must hold the leaf and the root")

// serveCA keeps a certificate from the CA: request one, publish it, sleep
// until the renewal point, repeat. Failed requests are retried with
// exponential backoff and jitter while the previous certificate (if any) is
// still served. In Istio's mixed mode (RootsFromFile) the roots published
// with it are RootCertFile's, followed like file-mounted certificates.
func (s *Service) serveCA(ctx context.Context) error {
	ca := newCAClient(s)
	var rootsChanged <-chan []string
	var watchFailed <-chan error
	if s.cfg.Roots == RootsFromFile {
		watch, err := s.watchFiles(s.cfg.RootCertFile)
		if err != nil {
			return err
		}
		defer watch.Close()
		rootsChanged, watchFailed = watch.Changes(), watch.Failed()
		s.readRootFile()
	}

	kept := ca.start()
	if kept {
		s.publishCA()
	}
	anchorsChanged, anchors := s.takeAnchors()
	if anchorsChanged && kept {
		ca.resign()
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-watchFailed:
			return err
		case <-rootsChanged:
			s.readRootFile()
			s.publishCA()
			continue
		case <-anchors:
			if anchorsChanged, anchors = s.takeAnchors(); anchorsChanged && s.caIssued.Version != "" {
				ca.resign()
			}
			continue
		case <-ca.due:
		}
		wait, ok, err := ca.renew(ctx, s.caFailure)
		if err != nil {
			return err
		}
		if ok {
			s.caFailuresInARow = 0
			s.publishCA()
			s.log.Info("certificate from CA", "spiffe_id", s.cfg.SpiffeID(), "expiry", s.caIssued.Expiry, "renew_in", wait.Round(time.Millisecond))
		}
	}
}

// takeAnchors reads the ProxyConfig's trust anchors: whether they differ
// from those last read, and a channel closed at their next change (nil
// without the input: never).
func (s *Service) takeAnchors() (changed bool, next <-chan struct{}) {
	if s.anchors == nil {
		return false, nil
	}
	a, _, next := s.anchors.Watch()
	joined := bytes.Join(a.PEM, nil)
	changed = !bytes.Equal(joined, s.anchorsSeen)
	s.anchorsSeen = joined
	return changed, next
}

// publishCA publishes the CA's last certificate with its roots: the CA's, or
// (RootsFromFile) the root file's last good ones.
func (s *Service) publishCA() {
	b := s.caIssued
	if b.Version == "" {
		return
	}
	if s.cfg.Roots == RootsFromFile {
		if s.fileRoots == nil {
			s.report(messages.Starting, "no usable certificate: "+s.fileRootsErr.Error())
			return
		}
		b = withRoots(b, s.fileRoots)
	}
	s.publish(b)
	if s.fileRootsErr != nil {
		s.report(messages.Degraded, "rejected root certificate update (serving the previous roots): "+s.fileRootsErr.Error())
		return
	}
	s.report(messages.Ready, "")
}

// readRootFile reads RootCertFile (RootsFromFile); a bad file keeps the last
// good roots.
func (s *Service) readRootFile() {
	roots, err := boundedfile.Read(s.cfg.RootCertFile, boundedfile.MaxPEM)
	if err != nil {
		err = fmt.Errorf("read root certificates: %w", err)
	} else if _, perr := parseCerts(roots); perr != nil {
		err = fmt.Errorf("root certificates %s: %w", s.cfg.RootCertFile, perr)
	}
	if err != nil {
		s.m.fileFailures.Inc()
		s.fileRootsErr = err
		s.log.Warn("rejected root certificate file", "error", err)
		if s.caIssued.Version == "" {
			s.report(messages.Starting, "no usable root certificates: "+err.Error())
		}
		return
	}
	s.fileRoots, s.fileRootsErr = roots, nil
}

// caFailure reports a failed request; the reason carries the CA's own error.
func (s *Service) caFailure(err error) {
	reason := "certificate request failed: " + err.Error()
	s.caFailuresInARow++
	if s.caFailuresInARow == 1 && s.caIssued.Version == "" {
		// The first try at start often comes before the CA (or, in
		// standalone mode, the CA's root file) is up: expected, not a
		// warning (issue 22). A second failure in a row is one.
		s.log.Info("certificate request failed; retrying (the CA may still be starting)", "ca", s.cfg.CAAddr, "error", err)
	} else {
		s.log.Warn("certificate request failed", "ca", s.cfg.CAAddr, "error", err, "failures_in_a_row", s.caFailuresInARow)
	}
	if b := s.caIssued; b.Version != "" {
		if now := s.clock.Now(); now.Before(b.Expiry) {
			reason += fmt.Sprintf(" (serving the previous certificate until it expires at %s)", b.Expiry.UTC().Format(time.RFC3339))
		} else {
			reason += fmt.Sprintf(" (the previous certificate expired at %s)", b.Expiry.UTC().Format(time.RFC3339))
		}
		s.report(messages.Degraded, reason)
		return
	}
	s.report(messages.Starting, reason)
}

// caClient asks the CA, and paces the requests. Used by Serve's goroutine
// only.
type caClient struct {
	s       *Service
	backoff time.Duration // the wait after the next failure, before jitter
	// due fires when the CA is to be asked next (renew); nil, never,
	// until start.
	due <-chan time.Time
}

func newCAClient(s *Service) *caClient {
	return &caClient{s: s, backoff: s.cfg.RetryInitial}
}

// resign asks the CA for a new certificate now: Istio's agent drops its
// workload certificate when the ProxyConfig's trust anchors change
// (UpdateConfigTrustBundle), so that the next one is issued under them.
func (c *caClient) resign() {
	c.s.log.Info("the ProxyConfig's trust anchors changed: asking the CA for a new certificate now")
	c.due = c.s.clock.After(0)
}

// start sets when the CA is first asked: at once, or, after a restart
// with a certificate from the CA still valid (kept), at the renewal point
// chosen when it was issued, which /debug/certs shows (#22), not a new
// jittered one.
func (c *caClient) start() (kept bool) {
	now := c.s.clock.Now()
	if b := c.s.caIssued; b.Version != "" && now.Before(b.Expiry) {
		c.due = c.s.clock.After(max(b.RenewAt.Sub(now), 0))
		return true
	}
	c.due = c.s.clock.After(0)
	return false
}

// renew asks the CA for a certificate and keeps it (caIssued). It sets
// when the CA is asked again (due), and returns how long until then: the
// certificate's renewal point, or after a failure (handed to failed) a
// backoff that doubles up to RetryMax, with jitter. ok says the CA
// answered; err is ctx's, when it ended meanwhile.
func (c *caClient) renew(ctx context.Context, failed func(error)) (wait time.Duration, ok bool, err error) {
	b, err := c.request(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return 0, false, ctx.Err()
		}
		failed(err)
		wait, c.backoff = jittered(c.backoff), min(c.backoff*2, c.s.cfg.RetryMax)
		c.due = c.s.clock.After(wait)
		return wait, false, nil
	}
	c.backoff = c.s.cfg.RetryInitial
	wait = c.s.renewDelay(b)
	b.RenewAt = c.s.clock.Now().Add(wait)
	c.s.caIssued = b
	c.due = c.s.clock.After(wait)
	return wait, true, nil
}

// request asks the CA for a certificate, on a connection of its own: the
// next request, hours later at the renewal point, handshakes anew with the
// CA's roots and the client certificate (PROV_CERT) of that moment. A VM
// whose onboarding token has expired then renews with the certificate it
// was last issued, and a CA that moved or a rotated CA_ROOT_CA is met at
// once rather than after a failure.
func (c *caClient) request(ctx context.Context) (messages.CertBundle, error) {
	conn, err := c.s.dialCA()
	if err != nil {
		return messages.CertBundle{}, err
	}
	defer conn.Close()
	// Connect now, so that the TCP and TLS handshakes with the CA run
	// while the key is generated (RSA 2048, Istio's default: tens of ms
	// of CPU) instead of after it, as the CSR's RPC would start them
	// (#24: the certificate is on the readiness path).
	conn.Connect()
	b, err := c.s.requestCertificate(ctx, pb.NewIstioCertificateServiceClient(conn))
	if err != nil && ctx.Err() == nil {
		c.s.m.outgoingFailed.WithLabelValues("csr").Inc()
	}
	return b, err
}

// renewDelay is how long until the renewal point: when GraceRatio (± jitter)
// of the certificate's lifetime remains, as Istio's secret cache does.
func (s *Service) renewDelay(b messages.CertBundle) time.Duration {
	leaf, err := parseCerts(b.CertChainPEM)
	if err != nil {
		return 0
	}
	lifetime := b.Expiry.Sub(leaf[0].NotBefore)
	ratio := s.cfg.GraceRatio
	if j := s.cfg.GraceJitter; j > 0 {
		ratio += (rand.Float64()*2 - 1) * j
	}
	at := b.Expiry.Add(-time.Duration(ratio * float64(lifetime)))
	return max(at.Sub(s.clock.Now()), 0)
}

// jittered spreads d by ±20% so that many agents do not retry in step.
func jittered(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// dialCA builds the client connection (lazily connected by gRPC).
func (s *Service) dialCA() (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if !s.cfg.CAPlaintext {
		pool, err := s.caRoots()
		if err != nil {
			return nil, err
		}
		tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, ServerName: s.cfg.caServerName()}
		if s.cfg.ProvCertDir != "" {
			// A VM renews with the certificate it was last issued once
			// its onboarding token has expired (Istio's GetKeyCertsForCA).
			tc.GetClientCertificate = clientcert.InDir(s.cfg.ProvCertDir).GetClientCertificate(s.clock.Now, s.log, "the CA")
		}
		s.cfg.CompliancePolicy.Apply(tc)
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(s.cfg.CAAddr,
		grpc.WithTransportCredentials(creds),
		grpc.WithPerRPCCredentials(tokenCredentials{path: s.cfg.TokenFile, secure: !s.cfg.CAPlaintext}))
	if err != nil {
		return nil, fmt.Errorf("CA client for %s: %w", s.cfg.CAAddr, err)
	}
	return conn, nil
}

// caRoots are the roots that verify the CA: CARootFile's, or the OS's.
func (s *Service) caRoots() (*x509.CertPool, error) {
	if s.cfg.CARootFile == "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			return nil, fmt.Errorf("system root certificates: %w", err)
		}
		return pool, nil
	}
	pemBytes, err := boundedfile.Read(s.cfg.CARootFile, boundedfile.MaxPEM)
	if err != nil {
		return nil, fmt.Errorf("CA root certificate (CA_ROOT_CA): %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("CA root certificate %s: %w", s.cfg.CARootFile, ErrNoCertificate)
	}
	return pool, nil
}

// requestCertificate generates a key, sends the CSR and checks the answer.
func (s *Service) requestCertificate(ctx context.Context, client pb.IstioCertificateServiceClient) (messages.CertBundle, error) {
	began := s.clock.Now()
	key, err := s.workloadKey(ctx)
	if err != nil {
		return messages.CertBundle{}, err
	}
	keyPEM, csrPEM, err := newCSR(key, s.cfg)
	if err != nil {
		return messages.CertBundle{}, err
	}
	generated := s.clock.Now()
	req := &pb.IstioCertificateRequest{
		Csr:              string(csrPEM),
		ValidityDuration: int64(s.cfg.SecretTTL / time.Second),
	}
	if s.cfg.CertSigner != "" {
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			"CertSigner": structpb.NewStringValue(s.cfg.CertSigner),
		}}
	}
	md := metadata.MD{}
	if s.cfg.ClusterID != "" {
		md.Set("ClusterID", s.cfg.ClusterID)
	}
	for k, v := range s.cfg.CAHeaders {
		md.Set(k, v)
	}
	callCtx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, md), s.cfg.RequestTimeout)
	defer cancel()
	s.m.outgoing.WithLabelValues("csr").Inc()
	resp, err := client.CreateCertificate(callCtx, req)
	if err != nil {
		return messages.CertBundle{}, fmt.Errorf("CreateCertificate at %s: %w", s.cfg.CAAddr, err)
	}
	// Where a start's certificate time goes (#24).
	s.log.Debug("CSR signed", "key_algorithm", s.cfg.KeyAlgorithm, "keygen", generated.Sub(began).Round(time.Microsecond),
		"signing", s.clock.Now().Sub(generated).Round(time.Microsecond))
	if len(resp.CertChain) <= 1 {
		return messages.CertBundle{}, fmt.Errorf("CreateCertificate at %s: %w (got %d)", s.cfg.CAAddr, ErrShortChain, len(resp.CertChain))
	}
	var chain strings.Builder
	for _, c := range resp.CertChain {
		chain.WriteString(c)
		if !strings.HasSuffix(c, "\n") {
			chain.WriteString("\n")
		}
	}
	root := resp.CertChain[len(resp.CertChain)-1]
	if !strings.HasSuffix(root, "\n") {
		root += "\n"
	}
	src := "CA " + s.cfg.CAAddr
	return buildBundle([]byte(chain.String()), keyPEM, []byte(root),
		bundleSources{chain: src + " response", key: "generated key", roots: src + " response (last element)"}, s.clock.Now())
}

// tokenCredentials sends the JWT from a file, re-read on every call so that
// a rotated token is used at once. No file ⇒ no header.
type tokenCredentials struct {
	path   string
	secure bool
}

func (t tokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if t.path == "" {
		return nil, nil
	}
	tok, err := boundedfile.Read(t.path, boundedfile.MaxToken)
	if err != nil || len(strings.TrimSpace(string(tok))) == 0 {
		return nil, nil
	}
	return map[string]string{"authorization": "Bearer " + strings.TrimSpace(string(tok))}, nil
}

func (t tokenCredentials) RequireTransportSecurity() bool { return t.secure }

// caServerName is the name the CA's certificate must carry, as Istio's CA
// client checks it (pilot/pkg/grpc/tls.go): CAServerName (ISTIOD_SAN, for
// a CA at the discovery address) when set, else the host of CA_ADDR, and
// "localhost" (a port-forward) as istiod.istio-system.svc. An istiod
// reached by IP has no IP SAN: ISTIOD_SAN is how a pod names it.
func (c Config) caServerName() string {
	if c.CAServerName != "" {
		return c.CAServerName
	}
	host := hostOf(c.CAAddr)
	if strings.Contains(host, "localhost") {
		return "istiod.istio-system.svc"
	}
	return host
}

func hostOf(addr string) string {
	if i := strings.LastIndex(addr, ":"); i >= 0 {
		return strings.Trim(addr[:i], "[]")
	}
	return addr
}
