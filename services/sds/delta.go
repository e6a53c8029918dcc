package sds

import (
	"context"
	"log/slog"
	"maps"
	"slices"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/services/internal/unique"
)

// DeltaSecrets is incremental SDS: only the changed secrets are sent, each
// with its own version, and a secret that cannot be served is in the
// response's resource_errors. (Istio answers Unimplemented; gRPC clients and
// Envoys configured for delta SDS use it.)
func (h *handler) DeltaSecrets(stream grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]) error {
	ss := h.newSession(stream.Context(), "delta", true)
	var (
		subscribed  = map[string]bool{}
		bad         map[string]error
		sentVersion = map[string]string{} // name → version of the secret sent
		sentErr     = map[string]string{} // name → error last told
	)
	handle := func(req *discoveryv3.DeltaDiscoveryRequest) ([]resource, bool, error) {
		if err := checkTypeURL(req.GetTypeUrl()); err != nil {
			return nil, false, err
		}
		if n := req.GetResponseNonce(); n != "" && n == ss.lastNonce && req.GetErrorDetail() != nil {
			h.svc.m.nacks.Inc()
			ss.log.Warn("Envoy rejected secrets (NACK)", "nonce", n, "error", req.GetErrorDetail().GetMessage())
		}
		for n, v := range req.GetInitialResourceVersions() {
			subscribed[n] = true
			sentVersion[n] = v
		}
		for _, n := range req.GetResourceNamesSubscribe() {
			subscribed[n] = true
		}
		for _, n := range req.GetResourceNamesUnsubscribe() {
			delete(subscribed, n)
			delete(sentVersion, n)
			delete(sentErr, n)
		}
		var rs []resource
		rs, bad = parseNames(slices.Sorted(maps.Keys(subscribed)))
		return rs, true, nil
	}
	push := func(secrets view) error {
		names := slices.Sorted(maps.Keys(subscribed))
		states := statesFor(names, bad, secrets)
		resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: SecretTypeURL}
		var served, failed []string
		for _, n := range names {
			s, ok := states[n]
			if !ok {
				continue
			}
			if s.secret != nil && s.version != sentVersion[n] {
				resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: n, Version: s.version, Resource: s.secret})
				served = append(served, n)
			}
			msg := ""
			if s.err != nil {
				msg = s.err.Error()
			}
			if msg != "" && msg != sentErr[n] {
				resp.ResourceErrors = append(resp.ResourceErrors, resourceError(n, s.err))
				failed = append(failed, n)
				ss.log.Warn("cannot serve secret", "name", n, "code", status.Code(s.err), "error", status.Convert(s.err).Message())
			}
			sentErr[n] = msg
		}
		if len(served)+len(failed) == 0 {
			return nil
		}
		resp.Nonce = ss.nextNonce()
		resp.SystemVersionInfo = responseVersion(slices.Collect(maps.Keys(states)), states)
		if err := stream.Send(resp); err != nil {
			return err
		}
		for _, r := range resp.Resources {
			sentVersion[r.Name] = r.Version
			h.svc.m.pushes.WithLabelValues(r.Name).Inc()
		}
		ss.log.Info("sent secrets", "names", served, "errors", failed, "nonce", resp.Nonce)
		return nil
	}
	return serveSession(ss, stream.Recv, handle, push)
}

// FetchSecrets answers once, waiting until every named secret exists (the
// workload certificate before the first one). A name that cannot be served
// fails the call with its status. (Istio answers Unimplemented.)
func (h *handler) FetchSecrets(ctx context.Context, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
	if err := checkTypeURL(req.GetTypeUrl()); err != nil {
		return nil, err
	}
	names := unique.Values(req.GetResourceNames())
	if len(names) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "FetchSecrets needs resource names (%q, %q, %s<path>, ...)", WorkloadKeyCertResourceName, RootCertResourceName, FileRootPrefix)
	}
	rs, bad := parseNames(names)
	for _, n := range names {
		if err, ok := bad[n]; ok {
			return nil, err
		}
	}
	sub := &subscriber{store: h.store}
	defer sub.close()
	if err := sub.want(ctx, rs); err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, err
	}
	for {
		secrets, _, changed := h.store.views.Watch()
		if states := statesFor(names, nil, secrets); len(states) == len(names) {
			resources, err := secretsOf(names, states)
			if err != nil {
				return nil, err
			}
			resp := &discoveryv3.DiscoveryResponse{TypeUrl: SecretTypeURL, Resources: resources,
				VersionInfo: responseVersion(names, states)}
			h.svc.log.LogAttrs(ctx, slog.LevelDebug, "fetched secrets", slog.Any("names", names), slog.String("version", resp.VersionInfo))
			return resp, nil
		}
		select {
		case <-changed:
		case <-h.stop:
			return nil, errShuttingDown
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}
