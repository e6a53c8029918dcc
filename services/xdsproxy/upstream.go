package xdsproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/services/internal/clientcert"
)

// The control plane side. Each Envoy stream gets its own connection and
// stream, as in Istio: a new stream may land on another istiod, and must
// not inherit messages meant for the old one. The dial options are built
// for every connection, so that a rotated root or client certificate is
// used by the next one (Istio rebuilds them when the root file changes).

const (
	adsService   = "envoy.service.discovery.v3.AggregatedDiscoveryService"
	windowSize   = 1 << 20 // see dialOptions
	maxMsgSize   = math.MaxInt32
	clusterIDKey = "ClusterID"
)

var adsStreamDesc = grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// upstream is one open stream to the control plane.
type upstream struct {
	conn   *grpc.ClientConn
	stream grpc.ClientStream
	cancel context.CancelFunc
}

// close ends the stream and its connection. Blocked Send and Recv calls
// return.
func (u *upstream) close() {
	u.cancel()
	_ = u.conn.Close()
}

// release ends the stream and returns its connection, open, for another.
func (u *upstream) release() *grpc.ClientConn {
	u.cancel()
	return u.conn
}

// openUpstream connects and opens an ADS stream (method: the protocol's,
// protocol.Protocol.Method), with the per-stream metadata: ClusterID,
// XDS_HEADER_* headers, and the bearer token, read afresh.
func (s *Service) openUpstream(ctx context.Context, method string) (*upstream, error) {
	conn := s.warm.take() // warmconn.go
	if conn == nil {
		var err error
		if conn, err = s.newConn(); err != nil {
			return nil, err
		}
	}
	md := metadata.MD{}
	if s.cfg.ClusterID != "" {
		md.Append(clusterIDKey, s.cfg.ClusterID)
	}
	for k, v := range s.cfg.Headers {
		md.Append(k, v)
	}
	if tok := s.token(); tok != "" {
		md.Append("authorization", "Bearer "+tok)
	}
	sctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, md))

	// NewStream waits for the connection while it is being made; bound
	// that wait (Istio's 5s dial timeout) with the service's clock.
	type result struct {
		cs  grpc.ClientStream
		err error
	}
	opened := make(chan result, 1)
	go func() {
		cs, err := conn.NewStream(sctx, &adsStreamDesc, method)
		opened <- result{cs, err}
	}()
	var r result
	select {
	case r = <-opened:
	case <-s.clock.After(s.cfg.DialTimeout):
		cancel()
		r = <-opened
		if r.err == nil {
			r.err = errors.New("stream opened after the timeout")
		}
		r.err = status.Errorf(codes.Unavailable, "connecting to %s: no connection within %v: %v", s.cfg.DiscoveryAddress, s.cfg.DialTimeout, r.err)
	}
	if r.err != nil {
		cancel()
		_ = conn.Close()
		return nil, r.err
	}
	return &upstream{conn: conn, stream: r.cs, cancel: cancel}, nil
}

// token is the bearer token, read for every stream: the kubelet rotates it.
// No file (or none configured) means no header, as in Istio.
func (s *Service) token() string {
	if s.cfg.TokenFile == "" {
		return ""
	}
	b, err := readToken(s.cfg.TokenFile)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("cannot read the token for the control plane; connecting without it", "file", s.cfg.TokenFile, "error", err)
		}
		return ""
	}
	return strings.TrimSpace(string(b))
}

// dialOptions are Istio's client options (pilot/pkg/grpc ClientOptions):
// keepalive, no receive limit, TLS 1.2+ or plaintext; and the raw codec.
// newConn is a connection to the control plane, not yet connected: for a
// stream (openUpstream) or made ahead of one (warmUp).
func (s *Service) newConn() (*grpc.ClientConn, error) {
	opts, err := s.dialOptions()
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(s.cfg.DiscoveryAddress, opts...)
	if err != nil {
		return nil, fmt.Errorf("control plane address %q: %w", s.cfg.DiscoveryAddress, err)
	}
	return conn, nil
}

func (s *Service) dialOptions() ([]grpc.DialOption, error) {
	creds := insecure.NewCredentials()
	if !s.cfg.Plaintext {
		tc, err := s.tlsConfig()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: s.cfg.KeepaliveInterval, Timeout: s.cfg.KeepaliveTimeout}),
		// Istio's 1 MiB windows. 4 MiB ones measured no faster on a
		// 10,000-cluster push (bench/xds) and held 5 MiB more at peak:
		// what the window admits waits in gRPC's buffers until read.
		// Read a large push in fewer, larger reads (default 32 KiB).
		grpc.WithReadBufferSize(256 << 10),
		grpc.WithInitialWindowSize(windowSize),
		grpc.WithInitialConnWindowSize(windowSize),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.ForceCodecV2(s.codec)),
		// Ours (#24): the receive buffers are not pooled, so that a
		// response's frame holds gRPC's buffers as they are (package rawxds)
		// instead of a copy joined out of buffers gRPC recycles. A push
		// then allocates its size once (its DATA frames, as a pool would
		// have) and is held once, where a copy besides pooled buffers held
		// it twice, and the pool a third time until the next GC.
		experimental.WithBufferPool(mem.NopBufferPool{}),
		// Ours: a connection made ahead of its stream (warmconn.go) does
		// not stay connected long without one.
		grpc.WithIdleTimeout(warmIdle),
	}, nil
}

// tlsConfig: roots from the configured source, the server name Istio
// checks, and the workload certificate when configured and not expired.
func (s *Service) tlsConfig() (*tls.Config, error) {
	var pool *x509.CertPool
	switch s.cfg.Roots {
	case RootsSystem:
		p, err := x509.SystemCertPool()
		if err != nil {
			return nil, fmt.Errorf("system roots for the control plane (XDS_ROOT_CA=SYSTEM): %w", err)
		}
		pool = p
	case RootsFile:
		b, err := readPEMFile(s.cfg.RootCAFile)
		if err != nil {
			return nil, fmt.Errorf("root CA for the control plane: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("root CA for the control plane: %s holds no PEM certificate", s.cfg.RootCAFile)
		}
	case RootsCertBundle:
		b, ok := s.bundle()
		if !ok || len(b.RootsPEM) == 0 {
			return nil, errors.New("root CA for the control plane: no certificate bundle with roots yet (file-mounted certs)")
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b.RootsPEM) {
			return nil, fmt.Errorf("root CA for the control plane: the certificate bundle's roots (version %s) hold no PEM certificate", b.Version)
		}
	}
	tc := &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    pool,
		ServerName: s.cfg.serverName(),
	}
	switch {
	case s.cfg.ClientCertificate:
		tc.GetClientCertificate = s.clientCertificate
	case s.cfg.ProvCertDir != "":
		tc.GetClientCertificate = clientcert.InDir(s.cfg.ProvCertDir).GetClientCertificate(s.clock.Now, s.log, "the control plane")
	}
	s.cfg.CompliancePolicy.Apply(tc)
	return tc, nil
}

// clientCertificate is the workload certificate of the latest bundle, or
// none (an empty certificate) when there is none or it has expired: the
// token then authenticates alone, as in Istio.
func (s *Service) clientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	b, ok := s.bundle()
	if !ok || len(b.CertChainPEM) == 0 {
		return &tls.Certificate{}, nil
	}
	if !b.Expiry.IsZero() && !s.clock.Now().Before(b.Expiry) {
		s.log.Warn("workload certificate expired: connecting to the control plane with the token only", "expiry", b.Expiry, "version", b.Version)
		return &tls.Certificate{}, nil
	}
	c, err := tls.X509KeyPair(b.CertChainPEM, b.KeyPEM)
	if err != nil {
		return nil, fmt.Errorf("workload certificate (version %s): %w", b.Version, err)
	}
	return &c, nil
}
