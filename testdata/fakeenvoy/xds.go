package main

import (
	"context"
	"fmt"
	"log"
	"time"

	// Resource types the fake decodes for /config_dump.
	_ "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

const (
	typeCluster  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	typeListener = "type.googleapis.com/envoy.config.listener.v3.Listener"
	typeSecret   = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
)

// startXDS connects to the ADS cluster named in dynamic_resources.ads_config
// (Istio's xds-grpc) and to the sds-grpc cluster, if the bootstrap has them.
// Both keep retrying until ctx ends: an absent socket is never fatal.
func (e *envoy) startXDS(ctx context.Context) {
	ads := e.boot.GetDynamicResources().GetAdsConfig()
	if ads != nil {
		if name := ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName(); name != "" {
			delta := ads.GetApiType() == corev3.ApiConfigSource_DELTA_GRPC
			e.keepStreaming(ctx, name, func(ctx context.Context, conn *grpc.ClientConn) error {
				if delta {
					return e.adsDelta(ctx, conn)
				}
				return e.adsSotW(ctx, conn)
			})
		}
	}
	if staticCluster(e.boot, "sds-grpc") != nil {
		e.keepStreaming(ctx, "sds-grpc", e.sds)
	}
}

// keepStreaming runs stream against the cluster's unix socket in a loop,
// reconnecting after every failure, until ctx ends.
func (e *envoy) keepStreaming(ctx context.Context, cluster string, stream func(context.Context, *grpc.ClientConn) error) {
	c := staticCluster(e.boot, cluster)
	path := clusterAddress(c).GetPipe().GetPath()
	if path == "" {
		log.Printf("cluster %s: no pipe endpoint; not connecting", cluster)
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		lastErr := ""
		for ctx.Err() == nil {
			err := func() error {
				conn, err := grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					return err
				}
				defer conn.Close()
				return stream(ctx, conn)
			}()
			if err != nil && err.Error() != lastErr && ctx.Err() == nil {
				log.Printf("cluster %s (%s): %v; retrying", cluster, path, err)
				lastErr = err.Error()
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
}

// adsSotW subscribes to all clusters and listeners over state-of-the-world
// ADS and ACKs every response.
func (e *envoy) adsSotW(ctx context.Context, conn *grpc.ClientConn) error {
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	for _, t := range []string{typeCluster, typeListener} {
		if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: e.boot.GetNode(), TypeUrl: t}); err != nil {
			return err
		}
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		e.replaceAll(resp.GetTypeUrl(), resp.GetResources())
		if err := stream.Send(&discoveryv3.DiscoveryRequest{
			TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(),
		}); err != nil {
			return err
		}
	}
}

// adsDelta is adsSotW over incremental (delta) ADS.
func (e *envoy) adsDelta(ctx context.Context, conn *grpc.ClientConn) error {
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		return err
	}
	for _, t := range []string{typeCluster, typeListener} {
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: e.boot.GetNode(), TypeUrl: t}); err != nil {
			return err
		}
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		for _, r := range resp.GetResources() {
			e.record(resp.GetTypeUrl(), r.GetName(), decode(r.GetResource()))
		}
		for _, name := range resp.GetRemovedResources() {
			e.record(resp.GetTypeUrl(), name, nil)
		}
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{
			TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce(),
		}); err != nil {
			return err
		}
	}
}

// sds asks for Istio's two secrets, "default" and "ROOTCA", and ACKs every
// response.
func (e *envoy) sds(ctx context.Context, conn *grpc.ClientConn) error {
	stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	if err != nil {
		return err
	}
	names := []string{"default", "ROOTCA"}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: e.boot.GetNode(), TypeUrl: typeSecret, ResourceNames: names}); err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		for _, r := range resp.GetResources() {
			m := decode(r)
			e.record(resp.GetTypeUrl(), resourceName(m), m)
		}
		if err := stream.Send(&discoveryv3.DiscoveryRequest{
			TypeUrl: typeSecret, ResourceNames: names, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(),
		}); err != nil {
			return err
		}
	}
}

// replaceAll records a state-of-the-world response: it replaces all
// resources of its type.
func (e *envoy) replaceAll(typeURL string, resources []*anypb.Any) {
	e.mu.Lock()
	delete(e.received, typeURL)
	e.mu.Unlock()
	for _, r := range resources {
		m := decode(r)
		e.record(typeURL, resourceName(m), m)
	}
}

// decode unpacks an Any; an unknown type is kept as the Any itself.
func decode(a *anypb.Any) proto.Message {
	if a == nil {
		return nil
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return a
	}
	return m
}

// resourceName is the resource's name field, if it has one.
func resourceName(m proto.Message) string {
	if n, ok := m.(interface{ GetName() string }); ok && n.GetName() != "" {
		return n.GetName()
	}
	return fmt.Sprintf("%T", m)
}
