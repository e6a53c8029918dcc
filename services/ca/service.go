// Package ca is the embedded certificate authority of `meshagent
// standalone`: Istio's IstioCertificateService (istio.io/api
// security/v1alpha1) over TLS, signing the agent's CSR with a self-signed
// root kept on disk, so that the agent runs its real CA-client path.
package ca

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/loopback"
)

// Name is the service's name in logs, metrics, Health and /debug/tree.
const Name = "ca"

// ErrUnauthenticated: a request with neither a certificate the CA issued
// nor the bearer token the CA wants.
var ErrUnauthenticated = errors.New("request authenticate failure")

// Service is the CA.
type Service struct {
	cfg    Config
	health *messages.Reporter
	clock  messages.Clock
	log    *slog.Logger
	m      metrics
	server loopback.Server
}

// Inputs: the CA reads no channel.
type Inputs struct{}

// Outputs: the CA publishes on no channel.
type Outputs struct{}

// New returns the CA, or why cfg cannot work (the only check of cfg).
// Nothing is read or generated until Serve.
func New(cfg Config, _ Inputs, _ Outputs, rt messages.Runtime) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, health: rt.Health, clock: rt.Clock, log: rt.Log, m: newMetrics()}
	if err := rt.Register(s.m.all...); err != nil {
		return nil, err
	}
	return s, nil
}

// String is the service's name.
func (s *Service) String() string { return Name }

// Addr is the address the CA listens on, "" when it is not listening: for
// a caller that asked for port 0.
func (s *Service) Addr() string { return s.server.Addr() }

// Serve loads (or first generates) the root, issues the CA's serving
// certificate, and answers CreateCertificate until ctx is done.
func (s *Service) Serve(ctx context.Context) error {
	root, created, err := loadOrCreateRoot(s.cfg, s.clock.Now())
	if err != nil {
		return err
	}
	if created {
		s.log.Info("generated a new root", "cert", s.cfg.RootCertPath(), "key", s.cfg.RootKeyPath(), "not_after", root.cert.NotAfter)
	}
	serving, err := root.servingCertificate(s.cfg.ServingSANs, s.clock.Now())
	if err != nil {
		return err
	}
	issuedBy := x509.NewCertPool()
	issuedBy.AddCert(root.cert)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{serving},
		MinVersion:   tls.VersionTLS12,
		// A caller may present a certificate this CA issued (see
		// authenticate); one it did not issue, or an expired one, fails
		// the handshake, as with istiod.
		ClientAuth: tls.VerifyClientCertIfGiven,
		ClientCAs:  issuedBy,
	})))
	pb.RegisterIstioCertificateServiceServer(srv, &handler{svc: s, root: root})
	if err := s.server.Start(srv, s.cfg.Listen); err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	s.log.Info("CA listening", "address", s.server.Addr(), "root", s.cfg.RootCertPath(), "trust_domain", s.cfg.TrustDomain,
		"cert_lifetime", s.cfg.CertLifetime, "token_checked", s.cfg.Token != "")
	s.health.Report(messages.Ready, "")

	select {
	case <-s.server.Failed():
	case <-ctx.Done():
	}
	// Calls in flight finish, up to StopTimeout.
	if s.server.Stop(s.clock.After(s.cfg.StopTimeout)) {
		s.log.Warn("calls did not end in time; closed them", "timeout", s.cfg.StopTimeout)
	}
	if err := s.server.Err(); err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	return ctx.Err()
}

// handler answers IstioCertificateService with the root loaded by Serve.
type handler struct {
	pb.UnimplementedIstioCertificateServiceServer
	svc  *Service
	root *authority
}

// CreateCertificate signs the request's CSR, as Istio's CA server does
// (security/pkg/server/ca/server.go): authenticate the caller, sign, and
// answer the chain leaf first and the root last, one PEM certificate per
// element (the agent needs at least two and takes the last as its root).
func (h *handler) CreateCertificate(ctx context.Context, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	s := h.svc
	caller, err := s.authenticate(ctx)
	if err != nil {
		s.m.rejected.WithLabelValues("unauthenticated").Inc()
		s.log.Warn("certificate request refused", "error", err)
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	requested := time.Duration(req.GetValidityDuration()) * time.Second
	leaf, err := h.root.sign([]byte(req.GetCsr()), requested, s.cfg.CertLifetime, s.cfg.TrustDomain, caller.ids, s.clock.Now())
	if err != nil {
		code, reason := grpcError(err)
		s.m.rejected.WithLabelValues(reason).Inc()
		s.log.Warn("certificate request refused", "caller", caller.name, "error", err)
		return nil, status.Error(code, err.Error())
	}
	s.m.issued.Inc()
	ids := make([]string, len(leaf.cert.URIs))
	for i, u := range leaf.cert.URIs {
		ids[i] = u.String()
	}
	// The cluster the caller says it is in (Istio's ClusterID metadata),
	// logged for whoever reads the log; this CA does not check it.
	md, _ := metadata.FromIncomingContext(ctx)
	s.log.Info("certificate issued", "caller", caller.name, "cluster_id", strings.Join(md.Get("clusterid"), ","), "spiffe_ids", ids, "serial", leaf.cert.SerialNumber.Text(16),
		"not_after", leaf.cert.NotAfter, "lifetime", leaf.cert.NotAfter.Sub(leaf.cert.NotBefore), "requested", requested)
	return &pb.IstioCertificateResponse{CertChain: []string{string(leaf.pem), string(h.root.certPEM)}}, nil
}

// caller is who a request authenticated as: name for the log, and ids,
// the SPIFFE IDs it may ask for (nil: any in the trust domain).
type caller struct {
	name string
	ids  []*url.URL
}

// authenticate tries the caller's certificate, then its bearer token, in
// Istio's order (its ClientCertAuthenticator comes before the JWT one).
//
// A certificate this CA issued (verified by the TLS handshake) authenticates
// its SPIFFE IDs, and only those may be asked for: it is how a VM renews
// once the token it was onboarded with has expired (PROV_CERT). Otherwise
// the request wants a bearer token: the configured one, or any when none is
// configured, named in the log by its fingerprint, never the token itself.
func (s *Service) authenticate(ctx context.Context) (caller, error) {
	if ids := certificateIDs(ctx); len(ids) > 0 {
		names := make([]string, len(ids))
		for i, u := range ids {
			names[i] = u.String()
		}
		return caller{name: "certificate " + strings.Join(names, ","), ids: ids}, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var token string
	for _, v := range md.Get("authorization") {
		if scheme, t, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "Bearer") && strings.TrimSpace(t) != "" {
			token = strings.TrimSpace(t)
			break
		}
	}
	if token == "" {
		return caller{}, fmt.Errorf("%w: no client certificate and no bearer token (authorization: Bearer <token>)", ErrUnauthenticated)
	}
	sum := sha256.Sum256([]byte(token))
	name := "token sha256:" + hex.EncodeToString(sum[:6])
	if s.cfg.Token == "" {
		return caller{name: name + " (not checked)"}, nil
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.Token)) != 1 {
		return caller{}, fmt.Errorf("%w: the bearer token (%s) is not the CA's", ErrUnauthenticated, name)
	}
	return caller{name: name}, nil
}

// certificateIDs are the SPIFFE IDs of the client certificate the handshake
// verified, none without one.
func certificateIDs(ctx context.Context) []*url.URL {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	var ids []*url.URL
	for _, u := range info.State.VerifiedChains[0][0].URIs {
		if u.Scheme == "spiffe" {
			ids = append(ids, u)
		}
	}
	return ids
}

// grpcError maps a signing error to its code and its metric label.
func grpcError(err error) (codes.Code, string) {
	switch {
	case errors.Is(err, ErrBadCSR):
		return codes.InvalidArgument, "bad_csr"
	case errors.Is(err, ErrIdentity):
		return codes.PermissionDenied, "identity"
	}
	return codes.Internal, "internal"
}

type metrics struct {
	issued   prometheus.Counter
	rejected *prometheus.CounterVec

	all []prometheus.Collector // every one above, to register
}

func newMetrics() metrics {
	var mm messages.Metrics
	m := metrics{
		issued: mm.Counter("ca_certificates_issued_total", "Workload certificates signed."),
		rejected: mm.CounterVec("ca_requests_rejected_total",
			"Certificate requests refused, by reason (unauthenticated, bad_csr, identity, internal).", "reason"),
	}
	m.all = mm.Collectors()
	return m
}
