package sds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/messages"
)

var errShuttingDown = status.Error(codes.Unavailable, "SDS server shutting down")

// receive runs stream.Recv in its own goroutine so that the stream loop can
// also wait for new certificates. The goroutine ends when the stream does.
func receive[T any](h *handler, ctx context.Context, recv func() (T, error)) (<-chan T, <-chan error) {
	reqs := make(chan T)
	errc := make(chan error, 1)
	h.readers.Add(1)
	go func() {
		defer h.readers.Done()
		for {
			r, err := recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case reqs <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return reqs, errc
}

func endOfStream(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// StreamSecrets is state-of-the-world SDS, what Envoy uses. Each response
// holds every subscribed secret; one is sent when the subscription gains a
// name or a subscribed secret changes, and not before the first bundle.
func (h *handler) StreamSecrets(stream grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	ctx := stream.Context()
	id := h.svc.streamIDs.Add(1)
	log := h.svc.log.With("stream", id)
	h.svc.m.streams.Inc()
	defer h.svc.m.streams.Dec()
	log.Debug("SDS stream opened")
	defer log.Debug("SDS stream closed")

	reqs, recvErr := receive(h, ctx, stream.Recv)
	var (
		names     []string              // subscribed
		sent      = map[string]string{} // name → resource version sent
		lastNonce string
		nonces    int
	)
	bundle, have, changed := h.svc.certs.Watch()
	for {
		select {
		case <-h.stop:
			return errShuttingDown
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return endOfStream(err)
		case <-changed:
			bundle, have, changed = h.svc.certs.Watch()
		case req := <-reqs:
			if err := checkTypeURL(req.GetTypeUrl()); err != nil {
				return err
			}
			if req.GetResponseNonce() != "" {
				if req.GetResponseNonce() != lastNonce {
					log.Debug("ignoring request for a stale nonce", "nonce", req.GetResponseNonce())
					continue
				}
				if d := req.GetErrorDetail(); d != nil {
					h.svc.m.nacks.Inc()
					log.Warn("Envoy rejected secrets (NACK)", "names", req.GetResourceNames(),
						"version", req.GetVersionInfo(), "nonce", req.GetResponseNonce(), "error", d.GetMessage())
				} else {
					log.Debug("Envoy accepted secrets (ACK)", "names", req.GetResourceNames(), "version", req.GetVersionInfo())
				}
			}
			for _, n := range req.GetResourceNames() {
				if err := checkName(n); err != nil {
					log.Warn("rejecting SDS request", "error", err)
					return err
				}
			}
			names = slices.Clone(req.GetResourceNames())
			for n := range sent {
				if !slices.Contains(names, n) {
					delete(sent, n)
				}
			}
		}
		if !have || len(names) == 0 || !stale(names, sent, bundle) {
			continue
		}
		resp := &discoveryv3.DiscoveryResponse{VersionInfo: bundle.Version, TypeUrl: SecretTypeURL}
		for _, n := range names {
			a, err := secret(n, bundle)
			if err != nil {
				return status.Error(codes.Internal, err.Error())
			}
			resp.Resources = append(resp.Resources, a)
		}
		nonces++
		resp.Nonce = fmt.Sprintf("%d-%d", id, nonces)
		if err := stream.Send(resp); err != nil {
			return err
		}
		lastNonce = resp.Nonce
		for _, n := range names {
			sent[n] = resourceVersion(n, bundle)
			h.svc.m.pushes.WithLabelValues(n).Inc()
		}
		log.Info("sent secrets", "names", names, "version", bundle.Version, "nonce", resp.Nonce)
	}
}

// stale reports whether some subscribed secret was not sent at its current
// version.
func stale(names []string, sent map[string]string, b messages.CertBundle) bool {
	for _, n := range names {
		if v, ok := sent[n]; !ok || v != resourceVersion(n, b) {
			return true
		}
	}
	return false
}

// DeltaSecrets is incremental SDS: only the changed secrets are sent, each
// with its own version.
func (h *handler) DeltaSecrets(stream grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]) error {
	ctx := stream.Context()
	id := h.svc.streamIDs.Add(1)
	log := h.svc.log.With("stream", id, "delta", true)
	h.svc.m.streams.Inc()
	defer h.svc.m.streams.Dec()

	reqs, recvErr := receive(h, ctx, stream.Recv)
	subscribed := map[string]bool{}
	sent := map[string]string{}
	var lastNonce string
	nonces := 0
	bundle, have, changed := h.svc.certs.Watch()
	for {
		select {
		case <-h.stop:
			return errShuttingDown
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return endOfStream(err)
		case <-changed:
			bundle, have, changed = h.svc.certs.Watch()
		case req := <-reqs:
			if err := checkTypeURL(req.GetTypeUrl()); err != nil {
				return err
			}
			if req.GetResponseNonce() != "" && req.GetResponseNonce() == lastNonce {
				if d := req.GetErrorDetail(); d != nil {
					h.svc.m.nacks.Inc()
					log.Warn("Envoy rejected secrets (NACK)", "nonce", req.GetResponseNonce(), "error", d.GetMessage())
				}
			}
			for n, v := range req.GetInitialResourceVersions() {
				if err := checkName(n); err != nil {
					return err
				}
				subscribed[n] = true
				sent[n] = v
			}
			for _, n := range req.GetResourceNamesSubscribe() {
				if err := checkName(n); err != nil {
					log.Warn("rejecting SDS request", "error", err)
					return err
				}
				subscribed[n] = true
			}
			for _, n := range req.GetResourceNamesUnsubscribe() {
				delete(subscribed, n)
				delete(sent, n)
			}
		}
		if !have {
			continue
		}
		var resources []*discoveryv3.Resource
		var names []string
		for _, n := range []string{WorkloadKeyCertResourceName, RootCertResourceName} {
			v := resourceVersion(n, bundle)
			if !subscribed[n] || sent[n] == v {
				continue
			}
			a, err := secret(n, bundle)
			if err != nil {
				return status.Error(codes.Internal, err.Error())
			}
			resources = append(resources, &discoveryv3.Resource{Name: n, Version: v, Resource: a})
			names = append(names, n)
		}
		if len(resources) == 0 {
			continue
		}
		nonces++
		resp := &discoveryv3.DeltaDiscoveryResponse{
			SystemVersionInfo: bundle.Version, TypeUrl: SecretTypeURL, Resources: resources,
			Nonce: fmt.Sprintf("%d-%d", id, nonces),
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		lastNonce = resp.Nonce
		for _, r := range resources {
			sent[r.Name] = r.Version
			h.svc.m.pushes.WithLabelValues(r.Name).Inc()
		}
		log.Info("sent secrets", "names", names, "version", bundle.Version, "nonce", resp.Nonce)
	}
}

// FetchSecrets answers once, waiting for the first bundle if there is none.
func (h *handler) FetchSecrets(ctx context.Context, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
	if err := checkTypeURL(req.GetTypeUrl()); err != nil {
		return nil, err
	}
	if len(req.GetResourceNames()) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "FetchSecrets needs resource names (%q or %q)", WorkloadKeyCertResourceName, RootCertResourceName)
	}
	for _, n := range req.GetResourceNames() {
		if err := checkName(n); err != nil {
			return nil, err
		}
	}
	bundle, err := h.waitBundle(ctx)
	if err != nil {
		return nil, err
	}
	resp := &discoveryv3.DiscoveryResponse{VersionInfo: bundle.Version, TypeUrl: SecretTypeURL}
	for _, n := range req.GetResourceNames() {
		a, err := secret(n, bundle)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		resp.Resources = append(resp.Resources, a)
	}
	h.svc.log.LogAttrs(ctx, slog.LevelDebug, "fetched secrets", slog.Any("names", req.GetResourceNames()), slog.String("version", bundle.Version))
	return resp, nil
}

func (h *handler) waitBundle(ctx context.Context) (messages.CertBundle, error) {
	for {
		b, ok, changed := h.svc.certs.Watch()
		if ok {
			return b, nil
		}
		select {
		case <-changed:
		case <-h.stop:
			return messages.CertBundle{}, errShuttingDown
		case <-ctx.Done():
			return messages.CertBundle{}, status.FromContextError(ctx.Err()).Err()
		}
	}
}
