package main

import (
	"context"
	"fmt"
	"log"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// SDS warming, as Envoy (#24). The stand-in once asked for Istio's two
// secrets whatever its config named and turned LIVE without them; Envoy
// does neither, and Istio's readiness (Envoy LIVE) therefore waits for the
// workload certificate, which the stand-in hid.
//
//   - A secret named by an SdsSecretConfig with an sds_config is fetched by
//     an SdsApi (source/common/secret/sds_api.cc): one subscription, so one
//     gRPC stream, per secret and config source, shared by every cluster or
//     listener naming it (SecretManagerImpl's findOrCreate), started when
//     the first of them initialises and ended when the last is gone.
//   - Its init target is added to the init manager of each cluster or
//     listener naming it. A CDS cluster stays in warming_clusters_ until
//     its pre-init (EDS: its ClusterLoadAssignment) and then those targets
//     are done (source/common/upstream/cluster_manager_impl.cc,
//     ClusterImplBase::onPreInitComplete), which is when it asks for its
//     secrets. A listener's filter chains' transport sockets add theirs to
//     the listener's init manager, started at once
//     (source/common/listener_manager/listener_impl.cc); the bootstrap's
//     clusters and listeners wait the same way.
//   - Server init (source/server/server.cc) waits for the cluster manager
//     (all clusters initialised) before it asks for listeners, and for the
//     listeners before it turns LIVE.
//   - initial_fetch_timeout (15 s unset; Istio sets 0s on its "default" and
//     "ROOTCA" configs: pkg/model/authentication.go) lets the target go
//     ready without the secret; 0 waits forever. sds.<name>.init_fetch_timeout
//     counts it.
//   - A response without the secret is rejected (SdsApi::onConfigUpdate:
//     "Missing SDS resources").
//
// Not modelled: secrets over ADS (sds_config.ads, Istio's credentialName)
// are neither asked for nor waited for; an updated cluster that re-warms
// is shown in warming only, where Envoy also keeps the old one active.

// secretRef is one secret a cluster or listener names over SDS.
type secretRef struct {
	name    string
	src     *corev3.ApiConfigSource // its sds_config: the cluster to ask, the retry policy
	timeout time.Duration           // initial_fetch_timeout; 0 waits forever
}

// secretStream is a running SdsApi subscription.
type secretStream struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// clusterSecrets are the secrets a cluster's transport sockets name (each
// transport_socket_matches entry's too: Envoy builds every one).
func clusterSecrets(c *clusterv3.Cluster) []secretRef {
	sockets := []*corev3.TransportSocket{c.GetTransportSocket()}
	for _, m := range c.GetTransportSocketMatches() {
		sockets = append(sockets, m.GetTransportSocket())
	}
	return socketSecrets(sockets)
}

// listenerSecrets are the secrets a listener's filter chains' transport
// sockets name.
func listenerSecrets(l *listenerv3.Listener) []secretRef {
	sockets := []*corev3.TransportSocket{l.GetDefaultFilterChain().GetTransportSocket()}
	for _, fc := range l.GetFilterChains() {
		sockets = append(sockets, fc.GetTransportSocket())
	}
	return socketSecrets(sockets)
}

func socketSecrets(sockets []*corev3.TransportSocket) []secretRef {
	var out []secretRef
	for _, s := range sockets {
		if s.GetTypedConfig() != nil {
			findSecrets(s.GetTypedConfig().ProtoReflect(), &out)
		}
	}
	return out
}

// findSecrets collects every SdsSecretConfig fetched over gRPC in m,
// looking into Anys (a TLS context, or one wrapped by another transport
// socket).
func findSecrets(m protoreflect.Message, out *[]secretRef) {
	switch v := m.Interface().(type) {
	case *tlsv3.SdsSecretConfig:
		if src := v.GetSdsConfig().GetApiConfigSource(); src != nil && v.GetName() != "" {
			*out = append(*out, secretRef{name: v.GetName(), src: src, timeout: initialFetchTimeout(v.GetSdsConfig())})
		}
		return
	case *anypb.Any:
		if inner, err := v.UnmarshalNew(); err == nil {
			findSecrets(inner.ProtoReflect(), out)
		}
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool { findSecrets(mv.Message(), out); return true })
			}
		case fd.IsList():
			if fd.Message() != nil {
				for i := range v.List().Len() {
					findSecrets(v.List().Get(i).Message(), out)
				}
			}
		case fd.Message() != nil:
			findSecrets(v.Message(), out)
		}
		return true
	})
}

// secretsOf are the secrets a resource names: a cluster's or a listener's.
func secretsOf(m proto.Message) []secretRef {
	switch r := m.(type) {
	case *clusterv3.Cluster:
		return clusterSecrets(r)
	case *listenerv3.Listener:
		return listenerSecrets(r)
	}
	return nil
}

// secretReadyLocked: the secret's init target is done (it arrived, or its
// initial fetch timed out).
func (e *envoy) secretReadyLocked(name string) bool {
	_, ok := e.received[typeSecret][name]
	return ok || e.xds.sdsTimedOut[name]
}

func (e *envoy) secretsReadyLocked(refs []secretRef) bool {
	for _, r := range refs {
		if !e.secretReadyLocked(r.name) {
			return false
		}
	}
	return true
}

// clusterPreInitDoneLocked: the cluster no longer waits for its endpoints
// (an EDS cluster has its ClusterLoadAssignment), so it initialises its
// secrets.
func (e *envoy) clusterPreInitDoneLocked(c *clusterv3.Cluster) bool {
	if c.GetType() != clusterv3.Cluster_EDS {
		return true
	}
	name := c.GetName()
	if sn := c.GetEdsClusterConfig().GetServiceName(); sn != "" {
		name = sn
	}
	_, ok := e.xds.resources[typeEndpoint][name]
	return ok
}

// clusterWarmingLocked: a CDS cluster not initialised yet (Envoy's
// dynamic_warming_clusters).
func (e *envoy) clusterWarmingLocked(name string) bool {
	c, ok := e.xds.resources[typeCluster][name].(*clusterv3.Cluster)
	return ok && (!e.clusterPreInitDoneLocked(c) || !e.secretsReadyLocked(e.xds.secrets[typeCluster][name]))
}

// listenerWarmingLocked: an LDS listener still waiting for its route
// configs or secrets.
func (e *envoy) listenerWarmingLocked(name string) bool {
	l, ok := e.xds.resources[typeListener][name].(*listenerv3.Listener)
	if !ok {
		return false
	}
	return !e.allPresent(typeRoute, routeNames(l)) || !e.secretsReadyLocked(e.xds.secrets[typeListener][name])
}

// initializedLocked: every cluster or listener (typeURL), the
// bootstrap's and xDS's, has what it waits for (warming says which do
// not).
func (e *envoy) initializedLocked(typeURL string, warming func(name string) bool) bool {
	if !e.secretsReadyLocked(e.staticSecrets[typeURL]) {
		return false
	}
	for name := range e.xds.resources[typeURL] {
		if warming(name) {
			return false
		}
	}
	return true
}

// wantedSecretsLocked are the secrets whose subscriptions run: those of
// the bootstrap's clusters and listeners, of every LDS listener, and of
// every CDS cluster past its pre-init.
func (e *envoy) wantedSecretsLocked() map[string]secretRef {
	wanted := map[string]secretRef{}
	add := func(refs []secretRef) {
		for _, r := range refs {
			if _, ok := wanted[r.name]; !ok {
				wanted[r.name] = r
			}
		}
	}
	add(e.staticSecrets[typeCluster])
	add(e.staticSecrets[typeListener])
	for name, refs := range e.xds.secrets[typeListener] {
		if _, ok := e.xds.resources[typeListener][name]; ok {
			add(refs)
		}
	}
	for name, refs := range e.xds.secrets[typeCluster] {
		if c, ok := e.xds.resources[typeCluster][name].(*clusterv3.Cluster); ok && e.clusterPreInitDoneLocked(c) {
			add(refs)
		}
	}
	return wanted
}

// reconcileSecrets starts a subscription for each secret now wanted and
// ends those no longer named, dropping their secret (Envoy destroys an
// SdsApi with its last user).
func (e *envoy) reconcileSecrets() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx == nil || e.ctx.Err() != nil { // not started, or shutting down
		return
	}
	wanted := e.wantedSecretsLocked()
	for name, s := range e.sdsStreams {
		if _, ok := wanted[name]; !ok {
			s.cancel()
			delete(e.sdsStreams, name)
			delete(e.received[typeSecret], name)
			delete(e.xds.sdsTimedOut, name)
		}
	}
	for name, ref := range wanted {
		if _, ok := e.sdsStreams[name]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(e.ctx)
		s := secretStream{ctx: ctx, cancel: cancel}
		e.sdsStreams[name] = s
		if ref.timeout > 0 {
			time.AfterFunc(ref.timeout, func() { e.secretTimedOut(s, name) })
		}
		var cluster string
		if svcs := ref.src.GetGrpcServices(); len(svcs) > 0 {
			cluster = svcs[0].GetEnvoyGrpc().GetClusterName()
		}
		if cluster == "" {
			log.Printf("secret %s: sds_config has no envoy_grpc cluster; not fetched", name)
			continue
		}
		e.keepStreaming(ctx, cluster, ref.src, e.sdsStream(s, name))
	}
}

// secretTimedOut is a secret's initial_fetch_timeout passing.
func (e *envoy) secretTimedOut(s secretStream, name string) {
	defer e.announceLive()
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.ctx.Err() != nil || e.secretReadyLocked(name) {
		return
	}
	e.xds.sdsTimedOut[name] = true
	e.bumpStatLocked("sds." + name + ".init_fetch_timeout")
	e.advanceInitLocked()
}

// sdsStream is the SdsApi subscription of one secret on one stream: ask
// for it (with the version held, as on a reconnect), then accept or
// reject each response.
func (e *envoy) sdsStream(s secretStream, name string) func(context.Context, *grpc.ClientConn, func()) error {
	return func(ctx context.Context, conn *grpc.ClientConn, received func()) error {
		stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
		if err != nil {
			return err
		}
		e.mu.Lock()
		version := e.received[typeSecret][name].version
		e.mu.Unlock()
		req := &discoveryv3.DiscoveryRequest{Node: e.boot.GetNode(), TypeUrl: typeSecret, ResourceNames: []string{name}, VersionInfo: version}
		for {
			if err := stream.Send(req); err != nil {
				return err
			}
			resp, err := stream.Recv()
			if err != nil {
				return err
			}
			received()
			req = &discoveryv3.DiscoveryRequest{TypeUrl: typeSecret, ResourceNames: []string{name}, VersionInfo: version,
				ResponseNonce: resp.GetNonce()}
			var secret proto.Message
			for _, r := range resp.GetResources() {
				if m := decode(r); resourceName(m) == name {
					secret = m
				}
			}
			if secret == nil {
				msg := fmt.Sprintf("Missing SDS resources for %s in onConfigUpdate()", name)
				log.Printf("rejecting secret %s version %s: %s", name, resp.GetVersionInfo(), msg)
				req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: msg}
				continue
			}
			version, req.VersionInfo = resp.GetVersionInfo(), resp.GetVersionInfo()
			e.mu.Lock()
			if s.ctx.Err() == nil { // not dropped meanwhile (reconcileSecrets cancels under e.mu)
				e.recordLocked(typeSecret, name, version, secret)
				e.advanceInitLocked()
			}
			e.mu.Unlock()
			e.announceLive()
		}
	}
}
