package sds

import (
	"log/slog"
	"slices"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/services/internal/unique"
)

var errShuttingDown = status.Error(codes.Unavailable, "SDS server shutting down")

// StreamSecrets is state-of-the-world SDS, what Envoy uses. A response is
// sent when the subscription gains a name or a subscribed secret changes,
// and holds those secrets only, as Istio's pushes do (SDS is not a type
// whose responses must hold every subscribed resource). A secret that is not
// there yet (the workload certificate before the first one) waits; one that
// cannot be served (a bad name, a missing file) is in the response's
// resource_errors with a gRPC status naming it and why, and the other
// secrets are served as usual. Istio instead ends the whole stream with the
// error (after retrying a missing file for 10 s), which stops every other
// secret on it until Envoy reconnects; Envoy does not read resource_errors,
// but its log names a secret it did not get, and ours does too.
func (h *handler) StreamSecrets(stream grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	ss := h.newSession(stream.Context())
	var (
		names []string              // subscribed
		bad   map[string]error      // subscribed names this server cannot serve
		sent  = map[string]string{} // name → secretState.key() sent
	)
	handle := func(req *discoveryv3.DiscoveryRequest) ([]resource, bool, error) {
		if err := checkTypeURL(req.GetTypeUrl()); err != nil {
			return nil, false, err
		}
		if !h.current(ss.log, req.GetResponseNonce(), ss.lastNonce, req.GetErrorDetail(), req.GetResourceNames(), req.GetVersionInfo()) {
			return nil, false, nil
		}
		names = unique.Values(req.GetResourceNames())
		for n := range sent {
			if !slices.Contains(names, n) {
				delete(sent, n)
			}
		}
		var rs []resource
		rs, bad = parseNames(names)
		return rs, true, nil
	}
	push := func(secrets view) error {
		states := statesFor(names, bad, secrets)
		var changedNames []string
		for _, n := range names {
			if s, ok := states[n]; ok && sent[n] != s.key() {
				changedNames = append(changedNames, n)
			}
		}
		if len(changedNames) == 0 {
			return nil
		}
		resp := &discoveryv3.DiscoveryResponse{TypeUrl: SecretTypeURL}
		var served, failed []string
		for _, n := range changedNames {
			s := states[n]
			if s.secret != nil {
				resp.Resources = append(resp.Resources, s.secret)
				served = append(served, n)
			}
			if s.err != nil {
				resp.ResourceErrors = append(resp.ResourceErrors, resourceError(n, s.err))
				failed = append(failed, n)
			}
		}
		resp.VersionInfo = responseVersion(changedNames, states)
		resp.Nonce = ss.nextNonce()
		if err := stream.Send(resp); err != nil {
			return err
		}
		for _, n := range changedNames {
			sent[n] = states[n].key()
		}
		for _, n := range served {
			h.svc.m.pushes.WithLabelValues(n).Inc()
		}
		for _, n := range changedNames {
			if err := states[n].err; err != nil {
				ss.log.Warn("cannot serve secret", "name", n, "code", status.Code(err), "error", status.Convert(err).Message())
			}
		}
		ss.log.Info("sent secrets", "names", served, "errors", failed, "version", resp.VersionInfo, "nonce", resp.Nonce)
		return nil
	}
	return serveSession(ss, stream.Recv, handle, push)
}

// current handles a request's response nonce: it logs an ACK or a NACK of
// the last response, and reports false for a request that answers an older
// response (Envoy sends one per response it got; only the latest counts).
func (h *handler) current(log *slog.Logger, nonce, lastNonce string, nack *statuspb.Status, names []string, version string) bool {
	if nonce == "" {
		return true
	}
	if nonce != lastNonce {
		log.Debug("ignoring request for a stale nonce", "nonce", nonce)
		return false
	}
	if nack != nil {
		h.svc.m.nacks.Inc()
		log.Warn("Envoy rejected secrets (NACK)", "names", names, "version", version, "nonce", nonce, "error", nack.GetMessage())
	} else {
		log.Debug("Envoy accepted secrets (ACK)", "names", names, "version", version)
	}
	return true
}

// parseNames splits names into those this server can serve and, with why,
// those it cannot.
func parseNames(names []string) ([]resource, map[string]error) {
	var rs []resource
	bad := map[string]error{}
	for _, n := range names {
		r, err := parseResourceName(n)
		if err != nil {
			bad[n] = err
			continue
		}
		rs = append(rs, r)
	}
	return rs, bad
}

// statesFor is what there is to say about each name: its state in the view,
// or its error if the name is bad. A name with neither is pending.
func statesFor(names []string, bad map[string]error, secrets view) map[string]secretState {
	out := make(map[string]secretState, len(names))
	for _, n := range names {
		if err, ok := bad[n]; ok {
			out[n] = secretState{err: err}
		} else if s, ok := secrets[n]; ok {
			out[n] = s
		}
	}
	return out
}

func resourceError(name string, err error) *discoveryv3.ResourceError {
	return &discoveryv3.ResourceError{
		ResourceName: &discoveryv3.ResourceName{Name: name},
		ErrorDetail:  status.Convert(err).Proto(),
	}
}

// secretsOf returns the secrets of states in names' order; with a name that
// has none, its error.
func secretsOf(names []string, states map[string]secretState) ([]*anypb.Any, error) {
	out := make([]*anypb.Any, 0, len(names))
	for _, n := range names {
		s := states[n]
		if s.secret == nil {
			return nil, s.err
		}
		out = append(out, s.secret)
	}
	return out, nil
}
