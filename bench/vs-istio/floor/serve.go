package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/klauspost/compress/gzhttp"
	"github.com/klauspost/compress/gzip"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// adsProxy passes each of Envoy's ADS streams to a stream of its own to
// the control plane, each message on as it comes, as Istio's agent does.
type adsProxy struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	upstream discoveryv3.AggregatedDiscoveryServiceClient
}

func (p *adsProxy) StreamAggregatedResources(down discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	up, err := p.upstream.StreamAggregatedResources(down.Context())
	if err != nil {
		return err
	}
	return pipe[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse](down, up)
}

func (p *adsProxy) DeltaAggregatedResources(down discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	up, err := p.upstream.DeltaAggregatedResources(down.Context())
	if err != nil {
		return err
	}
	return pipe[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse](down, up)
}

// pipe copies requests from down to up and responses back until either
// side ends; the server stream's end cancels up (its context is down's).
func pipe[Req, Resp any](down grpc.BidiStreamingServer[Req, Resp], up grpc.BidiStreamingClient[Req, Resp]) error {
	errs := make(chan error, 2)
	go forward(down.Recv, up.Send, errs)
	go forward(up.Recv, down.Send, errs)
	err := <-errs
	if err == io.EOF {
		return nil
	}
	return err
}

// forward sends what recv returns until either fails, then reports why.
func forward[M any](recv func() (*M, error), send func(*M) error, errs chan<- error) {
	for {
		m, err := recv()
		if err == nil {
			err = send(m)
		}
		if err != nil {
			errs <- err
			return
		}
	}
}

// secrets serves the workload certificate ("default") and the root
// ("ROOTCA") from the mounted files, read at each request.
type secrets struct {
	secretv3.UnimplementedSecretDiscoveryServiceServer
	dir string
}

func (s *secrets) StreamSecrets(stream secretv3.SecretDiscoveryService_StreamSecretsServer) error {
	var nonce int
	var asked []string // the names of the last answer
	for {
		req, err := stream.Recv()
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if req.ErrorDetail != nil || len(req.ResourceNames) == 0 {
			continue // a NACK, or nothing asked
		}
		if req.ResponseNonce == strconv.Itoa(nonce) && slices.Equal(req.ResourceNames, asked) {
			continue // the ACK of the last answer
		}
		nonce++
		asked = slices.Clone(req.ResourceNames)
		resp := &discoveryv3.DiscoveryResponse{TypeUrl: req.TypeUrl, VersionInfo: "1", Nonce: strconv.Itoa(nonce)}
		for _, name := range req.ResourceNames {
			secret, err := s.secret(name)
			if err != nil {
				return status.Error(codes.NotFound, err.Error())
			}
			a, err := anypb.New(secret)
			if err != nil {
				return err
			}
			resp.Resources = append(resp.Resources, a)
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func (s *secrets) secret(name string) (*tlsv3.Secret, error) {
	read := func(file string) (*corev3.DataSource, error) {
		b, err := os.ReadFile(filepath.Join(s.dir, file))
		if err != nil {
			return nil, err
		}
		return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}, nil
	}
	switch name {
	case "default":
		chain, err := read("cert-chain.pem")
		if err != nil {
			return nil, err
		}
		key, err := read("key.pem")
		if err != nil {
			return nil, err
		}
		return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: chain, PrivateKey: key}}}, nil
	case "ROOTCA":
		root, err := read("root-cert.pem")
		if err != nil {
			return nil, err
		}
		return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: root}}}, nil
	}
	return nil, fmt.Errorf("no secret %q", name)
}

// newStatus is the status port: readiness from Envoy's /ready, and the
// merged metrics (the floor's Go and process collectors under Istio's
// istio_agent_ prefix, then Envoy's exposition as it comes), compressed as
// both agents compress (Istio's status server is gzhttp's; Prometheus asks
// for gzip), at the cheapest setting either uses: meshagent's stateless
// gzip (services/status/routes.go).
func newStatus(adminPort int) (http.Handler, error) {
	reg := prometheus.NewRegistry()
	wrapped := prometheus.WrapRegistererWithPrefix("istio_agent_", reg)
	wrapped.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Envoy's admin on loopback: no proxy, each request bounded.
	client := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz/ready", func(w http.ResponseWriter, r *http.Request) {
		resp, err := envoyGet(r.Context(), client, adminPort, "/ready")
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
		if resp.StatusCode != http.StatusOK || !bytes.HasPrefix(body, []byte("LIVE")) {
			http.Error(w, "envoy not ready: "+string(bytes.TrimSpace(body)), http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("/stats/prometheus", func(w http.ResponseWriter, r *http.Request) {
		families, err := reg.Gather()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		format := expfmt.NewFormat(expfmt.TypeTextPlain)
		w.Header().Set("Content-Type", string(format))
		enc := expfmt.NewEncoder(w, format)
		for _, f := range families {
			if err := enc.Encode(f); err != nil {
				return
			}
		}
		resp, err := envoyGet(r.Context(), client, adminPort, "/stats/prometheus")
		if err != nil {
			return // the agent's metrics still matter (Istio's rule)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(w, resp.Body)
	})
	compress, err := gzhttp.NewWrapper(gzhttp.CompressionLevel(gzip.StatelessCompression))
	if err != nil {
		return nil, err
	}
	return compress(mux), nil
}
